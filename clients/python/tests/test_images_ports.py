"""Images through the client against a real ``corral serve`` with the
default policy (no ``server.policy.images``: clients may use only images
already on the daemon, and pull nothing)."""

from __future__ import annotations

import time

import pytest

import corral

from conftest import IMAGE

pytestmark = pytest.mark.server


def test_images_lists_what_the_daemon_holds_and_no_pulls(corral_client):
    listed = corral_client.images()
    names = [i["image"] for i in listed["images"]]
    assert any(n.startswith(IMAGE) for n in names), names
    assert not any(n.startswith("corral-snapshot") for n in names), names
    assert listed["pulls"] == []


def test_pull_of_a_present_image_is_a_no_op_and_a_missing_one_is_refused_naming_the_line(corral_client):
    done = corral_client.pull(IMAGE if ":" in IMAGE else IMAGE + ":latest")
    assert done["waited_ms"] >= 0
    with pytest.raises(corral.ForbiddenError) as e:
        corral_client.pull("python:3.12-slim")
    assert e.value.field == "image"
    assert "- 'python:*'" in str(e.value) and "server.policy.images" in str(e.value)
    with pytest.raises(corral.InvalidRequestError) as e:
        corral_client.pull("")
    assert e.value.field == "image"


@pytest.mark.asyncio
async def test_async_images_and_pull(corral_url):
    async with corral.AsyncClient(corral_url) as client:
        listed = await client.images()
        assert listed["images"], listed
        with pytest.raises(corral.ForbiddenError):
            await client.pull("python:3.12-slim")


def test_port_url_reaches_a_server_in_the_sandbox_without_the_bearer_token(corral_sandbox, corral_url):
    import urllib.parse

    import httpx

    r = corral_sandbox.run(
        "mkdir -p /www && echo served-by-httpd > /www/index.html && httpd -p 8081 -h /www </dev/null >/dev/null 2>&1"
        " && for i in $(seq 1 50); do wget -q -O /dev/null http://127.0.0.1:8081/ && exit 0; sleep 0.1; done; exit 1",
        timeout=60,
    )
    assert r.exit_code == 0, r
    link = corral_sandbox.port_link(8081)
    url = corral_sandbox.port_url(8081)
    assert url == link["url"], (url, link)
    # The link's host name is its own (PORT-ID.localhost): the link is an
    # origin of its own in a browser. A program that cannot resolve it
    # (glibc) connects to the listener and sends the name as Host.
    host = urllib.parse.urlsplit(url).netloc
    assert host == link["host"] and host.startswith("8081-") and ".localhost:" in host, link
    page = httpx.get(link["connect"] + link["path"], headers={"Host": link["host"]}, timeout=30)  # no token
    assert page.status_code == 200 and page.text == "served-by-httpd\n", page.text
    forged = httpx.get(link["connect"] + link["path"][:-5] + "0000/", headers={"Host": link["host"]}, timeout=30)
    assert forged.status_code == 403
    # Under the listener's own name the link's path is nothing.
    bare = httpx.get(link["connect"] + link["path"], timeout=30)
    assert bare.status_code == 404 and "served-by-httpd" not in bare.text, bare.text
    # The API's origin serves no page of a sandbox.
    assert not url.startswith(corral_url + "/"), url
    on_api = httpx.get(corral_url + link["path"], timeout=30)
    assert on_api.status_code == 401 and "served-by-httpd" not in on_api.text, on_api.text


COOKIE_SERVER = r"""
import http.server

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        if self.path.endswith("/set"):
            self.send_header("Set-Cookie", "sid=mine; Domain=localhost; Path=/; HttpOnly")
        self.end_headers()
        self.wfile.write(("cookie:" + (self.headers.get("Cookie") or "")).encode())

    def log_message(self, *args):
        pass

http.server.HTTPServer(("0.0.0.0", 8082), H).serve_forever()
"""


def test_a_port_gets_only_the_cookies_its_own_server_set_and_sets_none_beyond_its_host(corral_client, corral_spec):
    import httpx

    with corral_client.sandbox(spec=corral_spec(image="corral-test/python")) as sb:
        sb.write_file("/srv/cookies.py", COOKIE_SERVER.encode())
        r = sb.run(
            "nohup python3 /srv/cookies.py </dev/null >/dev/null 2>&1 &"
            " for i in $(seq 1 100); do python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8082/\")' 2>/dev/null && exit 0; sleep 0.1; done; exit 1",
            timeout=60,
        )
        assert r.exit_code == 0, r
        link = sb.port_link(8082)

        def get(path: str, cookie: str) -> httpx.Response:
            return httpx.get(
                link["connect"] + link["path"] + path,
                headers={"Host": link["host"], "Cookie": cookie},
                timeout=30,
            )

        # What a browser holds for the link's host name but its server never
        # set (another loopback app's session, a cookie another link's page
        # set on the parent domain) never reaches the sandbox.
        page = get("", "session=another-apps; sid=tossed")
        assert page.status_code == 200 and page.text == "cookie:", page.text
        # The server's own cookie is kept to the link's host name...
        page = get("set", "")
        assert page.headers.get_list("set-cookie") == ["sid=mine; Path=/; HttpOnly"], page.headers
        # ...and from then on passes, alone.
        page = get("", "session=another-apps; sid=mine")
        assert page.text == "cookie:sid=mine", page.text


def test_usage_moves_with_memory_and_stays_within_the_limit(corral_client, corral_spec):
    with corral_client.sandbox(spec=corral_spec(limits={"memory": 256 << 20})) as sb:
        before = sb.usage()
        assert before["memory_limit_bytes"] == 256 << 20
        r = sb.run("dd if=/dev/zero of=/dev/shm/fill bs=1M count=48 2>/dev/null || dd if=/dev/zero of=/tmp/fill bs=1M count=48")
        assert r.exit_code == 0, r
        after = sb.usage()
        assert after["memory_bytes"] >= before["memory_bytes"] + (44 << 20), (before, after)
        assert after["memory_bytes"] <= after["memory_limit_bytes"], after
        assert after["cpu_ns"] >= before["cpu_ns"] and after["pids"] >= 1, after


def test_results_say_what_a_command_used(corral_client, corral_spec):
    with corral_client.sandbox(spec=corral_spec(limits={"memory": 256 << 20})) as sb:
        assert sb.usage()["source"] == "engine"
        idle = sb.run("true")
        busy = sb.run("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
        big = sb.run("dd if=/dev/zero of=/dev/null bs=64M count=1 2>/dev/null")
        for r in (idle, busy, big):
            assert r.ok and isinstance(r.usage, corral.CommandUsage), r
            assert abs(r.usage.cpu_ms - r.usage.cpu_user_ms - r.usage.cpu_system_ms) < 0.01, r.usage
        assert busy.usage.cpu_ms >= 10 * idle.usage.cpu_ms and busy.usage.cpu_ms >= 20, (idle.usage, busy.usage)
        assert big.usage.peak_memory_bytes >= 64 << 20, big.usage
        assert idle.usage.peak_memory_bytes < 16 << 20, idle.usage
        # Every sandbox at once, from the service's sample (at most 10 s old).
        deadline = time.monotonic() + 30
        while True:
            every = corral_client.usage()
            mine = [x for x in every["sandboxes"] if x["id"] == sb.id]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(mine) == 1 and mine[0]["usage"]["memory_limit_bytes"] == 256 << 20, every
        # A shell session's command is measured by nobody.
        with sb.shell() as sh:
            assert sh.run("true").usage is None


def test_events_follow_a_sandbox_from_creation_to_removal(corral_client, corral_spec):
    import threading

    start = corral_client.events(after=0)
    with corral_client.sandbox(spec=corral_spec()) as sb:
        sb.run("true")
        sb.run("exit 3")
        sandbox_key = sb.id
    got = []

    def read():
        for ev in start:
            got.append(ev)
            if ev.get("kind") == "removed" and ev.get("session") == sandbox_key:
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(60)
    mine = [e for e in got if e.get("session") == sandbox_key]
    assert [(e["kind"], e.get("outcome")) for e in mine] == [
        ("created", None),
        ("command", "ok"),
        ("command", "exit"),
        ("removed", None),
    ], got
    assert all(a["id"] < b["id"] for a, b in zip(mine, mine[1:]))
