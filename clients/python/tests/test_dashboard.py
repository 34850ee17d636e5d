"""The dashboard in a real headless browser (Debian's chromium and
chromium-driver, driven by selenium from PyPI) against a real ``corral
serve``: the page asks for the token in a form (never in its address),
shows a sandbox the test created with its usage, updates when a command
runs (without a reload), and shows nothing without the token or with a
wrong one; code run from the page in
a sandbox's code context shows its plot as an image. Screenshots are kept
in ``target/test-artifacts/dashboard.png`` and ``dashboard-code.png``."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import corral

from conftest import REPO

pytestmark = pytest.mark.server

webdriver = pytest.importorskip("selenium.webdriver")


def _browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("the dashboard test needs chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    # Off the network (no background service of Chromium's reaches out).
    offline = (
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-sync",
        "--no-pings",
        "--disable-domain-reliability",
        "--metrics-recording-only",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1, EXCLUDE *.localhost",
    )
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900", *offline):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def login(browser, url, token):
    """Opens the dashboard at ``url`` and gives it ``token`` in its form."""
    from selenium.webdriver.common.by import By

    browser.get(f"{url}/dashboard")
    field = browser.find_element(By.ID, "token-input")
    field.send_keys(token)
    browser.find_element(By.ID, "login-button").click()


def _wait(what, predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"the dashboard never showed {what}")
        time.sleep(0.2)


def _in_row(browser, session, read):
    """``read`` of the sandboxes table's row of ``session``, or None while
    there is none. The table is drawn anew every 2 s: a row found a moment
    ago may be gone (stale), and is then looked for again next time."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        for tr in browser.find_elements(By.CSS_SELECTOR, "#sandboxes tr[data-sandbox]"):
            if tr.get_attribute("data-session") == session:
                return read(tr)
    except StaleElementReferenceException:
        pass
    return None


def _click_row(browser, session):
    """Clicks the row of ``session``; False when it was not there (or went
    stale under the click)."""
    return _in_row(browser, session, lambda tr: tr.click() or True) or False


def test_the_dashboard_shows_a_sandbox_its_usage_and_its_commands_live(corral_url, corral_client, corral_spec):
    from selenium.webdriver.common.by import By

    token = corral.find_token(corral_url)
    browser = _browser()
    try:
        with corral_client.sandbox(spec=corral_spec(limits={"memory": 256 << 20})) as sb:
            assert sb.run("true").exit_code == 0
            login(browser, corral_url, token)
            # The token never was in the address.
            assert token not in browser.current_url and "token" not in browser.current_url

            def text():
                return _in_row(browser, sb.id, lambda tr: tr.text) or ""

            def commands():
                return _in_row(browser, sb.id, lambda tr: int(tr.find_element(By.CSS_SELECTOR, "td.commands").text)) or 0

            _wait("the test's sandbox with its memory limit", lambda: "256M" in text())
            before = _wait("the first command counted", lambda: commands() >= 1 and commands())
            # A command that fails: counted, its outcome shown, no reload.
            sb.run("exit 3")
            _wait("the new command", lambda: commands() > before)
            _wait("its outcome", lambda: "exit" in text())
            _wait("the row clicked", lambda: _click_row(browser, sb.id))
            _wait("its recent commands", lambda: "exit 3" in browser.find_element(By.ID, "recent").text)
            out = REPO / "target" / "test-artifacts"
            out.mkdir(parents=True, exist_ok=True)
            assert browser.save_screenshot(str(out / "dashboard.png"))
            assert "corral" in browser.find_element(By.ID, "health").text

        # Without the token, or with a wrong one: nothing but the form.
        browser.get(f"{corral_url}/dashboard")
        assert not browser.find_element(By.ID, "board").is_displayed()
        login(browser, corral_url, "not-the-token")
        _wait("the refusal", lambda: "unauthorized" in browser.find_element(By.ID, "login-error").text)
        assert not browser.find_element(By.ID, "board").is_displayed()
        assert "sandboxes" not in browser.find_element(By.TAG_NAME, "body").text.lower()
        # A token in the address is not read (it is in the history already).
        browser.get(f"{corral_url}/dashboard?token={token}")
        _wait("the warning", lambda: "not read" in browser.find_element(By.ID, "login-error").text)
        assert not browser.find_element(By.ID, "board").is_displayed()
        assert "token" not in browser.current_url
    finally:
        browser.quit()


def test_the_dashboard_runs_code_and_shows_a_results_image(corral_url, corral_client, corral_spec):
    from selenium.webdriver.common.by import By

    image = os.environ.get("CORRAL_PYTHON_IMAGE", "corral-test/python")
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        pytest.skip(f"{image} is not built: scripts/build-test-images.sh --python")
    token = corral.find_token(corral_url)
    browser = _browser()
    try:
        with corral_client.sandbox(spec=corral_spec(image=image)) as sb:
            login(browser, corral_url, token)

            _wait("the test's sandbox", lambda: _click_row(browser, sb.id))
            box = browser.find_element(By.ID, "code")
            box.clear()
            box.send_keys("import matplotlib.pyplot as plt\nn = 20\nprint('plotted')\nplt.plot([3, 1, 2])\nplt.show()\n")
            browser.find_element(By.ID, "run-code").click()
            out = lambda: browser.find_element(By.ID, "code-out")  # noqa: E731
            _wait("the run's end", lambda: "done in" in browser.find_element(By.ID, "code-status").text, timeout=180)
            assert "plotted" in out().text
            img = _wait("the plot as an image", lambda: out().find_elements(By.TAG_NAME, "img"))[0]
            assert img.get_attribute("src").startswith("data:image/png;base64,iVBOR")
            # The browser decoded it: a real picture, not a broken image.
            width = browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img)
            assert width and width > 100, width
            shots = REPO / "target" / "test-artifacts"
            shots.mkdir(parents=True, exist_ok=True)
            assert browser.save_screenshot(str(shots / "dashboard-code.png"))
            # The kernel keeps state between runs from the page, and an error shows as one.
            box.clear()
            box.send_keys("n + 1")
            browser.find_element(By.ID, "run-code").click()
            _wait("the kept variable", lambda: out().text.strip() == "21", timeout=120)
            box.clear()
            box.send_keys("undefined_name")
            browser.find_element(By.ID, "run-code").click()
            _wait("the error", lambda: "NameError" in out().text, timeout=120)
    finally:
        browser.quit()
