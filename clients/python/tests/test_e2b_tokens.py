"""What each of an E2B sandbox's secrets opens, attacked through the real
``e2b`` SDK and plain HTTP against a real ``corral serve`` (the fixtures of
test_e2b.py): the traffic access token (for viewers of a private port)
opens the port relay and never a command or a file; a signed upload URL
writes the path it was signed for and nothing else; a signature's fields
cannot be run together into another path, operation or user; the sandbox
id carries 160 random bits; a page a sandbox serves through the relay may
post to its own origin, and a page of another site may not.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Dict

import httpx
import pytest

from test_e2b import (  # noqa: F401  (fixtures)
    TOKEN,
    _garbage_collected_inside_the_pool_lock,
    e2b,
    e2b_server,
    sbx,
)
from e2b import Sandbox  # noqa: E402

pytestmark = [
    pytest.mark.server,
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]


def _signed(path: str, operation: str, token: str, user: str = "") -> Dict[str, str]:
    """E2B's v1 signature of a file URL as its SDK makes it
    (e2b/sandbox/signature.py): SHA-256 over PATH:OPERATION:USER:TOKEN."""
    raw = f"{path}:{operation}:{user}:{token}"
    digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
    query = {"path": path, "signature": f"v1_{digest}"}
    if user:
        query["username"] = user
    return query


def _start(url: str, sandbox_id: str, headers: Dict[str, str], cmd: str) -> httpx.Response:
    """envd's process.Start (Connect streaming, JSON codec) running `cmd`."""
    body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}}).encode()
    frame = b"\x00" + len(body).to_bytes(4, "big") + body
    return httpx.post(
        f"{url}/process.Process/Start",
        content=frame,
        headers={"Content-Type": "application/connect+json", "E2b-Sandbox-Id": sandbox_id, **headers},
        timeout=30,
    )


def _serve(sandbox: Sandbox) -> None:
    """An httpd on port 8000 whose CGI script answers with the method it
    was sent and the body it read."""
    sandbox.commands.run(
        "mkdir -p /www/cgi-bin && printf '%s\\n' '#!/bin/sh' "
        "\"printf 'Content-Type: text/plain\\r\\n\\r\\n'\" 'echo \"$REQUEST_METHOD\"' 'cat' "
        "> /www/cgi-bin/echo && chmod 755 /www/cgi-bin/echo && echo page > /www/index.html"
    )
    sandbox.commands.run("httpd -f -p 8000 -h /www", background=True)
    sandbox.commands.run(
        "for i in $(seq 100); do netstat -ltn | grep -q ':8000 ' && exit 0; sleep 0.1; done; exit 1"
    )


def test_the_traffic_token_opens_ports_never_commands_or_files(e2b_server: Dict[str, str]) -> None:
    url = e2b_server["url"]
    private = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    try:
        private.files.write("/root/secret", "envd's only")
        _serve(private)
        traffic, envd = private.traffic_access_token, private._envd_access_token
        assert traffic and envd
        sid = private.sandbox_id

        # As a command's token, in either header: refused, nothing runs.
        for headers in ({"X-Access-Token": traffic}, {"E2b-Traffic-Access-Token": traffic}):
            r = _start(url, sid, headers, "touch /tmp/ran-with-the-traffic-token")
            # A streaming call's refusal is its end message (Connect).
            assert b'"unauthenticated"' in r.content and b'"start"' not in r.content, (headers, r.content)
            r = httpx.get(f"{url}/files", params={"path": "/root/secret"},
                          headers={"E2b-Sandbox-Id": sid, **headers}, timeout=30)
            assert r.status_code == 401 and b"envd's only" not in r.content, (headers, r.text)
            r = httpx.post(f"{url}/filesystem.Filesystem/ListDir", json={"path": "/root"},
                           headers={"E2b-Sandbox-Id": sid, **headers}, timeout=30)
            assert r.status_code == 401, (headers, r.text)
        # Nor does a file URL signed with it open anything.
        r = httpx.get(f"{url}/files", params=_signed("/root/secret", "read", traffic), timeout=30)
        assert r.status_code == 401 and b"envd's only" not in r.content, r.text
        ran = private.commands.run("test -e /tmp/ran-with-the-traffic-token && echo ran || echo not")
        assert ran.stdout == "not\n", ran.stdout

        assert traffic != envd
        # What it is for: the private port, through the relay.
        host = private.get_host(8000)
        r = httpx.get(f"{url}/index.html", headers={"Host": host, "E2b-Traffic-Access-Token": traffic}, timeout=30)
        assert r.status_code == 200 and r.text == "page\n", r.text
        # The envd token is not a traffic token.
        r = httpx.get(f"{url}/index.html", headers={"Host": host, "E2b-Traffic-Access-Token": envd}, timeout=30)
        assert r.status_code == 403, r.text
        # And the envd token still runs commands.
        assert private.commands.run("cat /root/secret").stdout == "envd's only"
    finally:
        private.kill()


def test_sandbox_ids_carry_160_random_bits(e2b_server: Dict[str, str]) -> None:
    a = Sandbox.create(timeout=60)
    b = Sandbox.create(timeout=60)
    try:
        for s in (a, b):
            assert re.fullmatch(r"i[0-9a-f]{40}", s.sandbox_id), s.sandbox_id
            # PORT-ID fits a DNS label.
            assert len(s.get_host(65535).split(".")[0]) <= 63
        assert a.sandbox_id != b.sandbox_id
        assert a.commands.run("echo ok").stdout == "ok\n"
    finally:
        a.kill()
        b.kill()


def test_a_signed_upload_writes_its_signed_path_only(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    url = e2b_server["url"]
    token = sbx._envd_access_token
    sbx.commands.run("mkdir -p /up && echo original > /root/.profile")
    signed = _signed("/up/one.txt", "write", token)

    # Two parts, the second naming /root/.profile: refused by name, nothing
    # written.
    files = [
        ("file", ("/up/one.txt", b"the signed one")),
        ("file", ("/root/.profile", b"echo owned")),
    ]
    r = httpx.post(f"{url}/files", params=signed, files=files, timeout=30)
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert message.startswith("body") and "2 parts" in message and "signed path" in message, message
    assert sbx.files.read("/root/.profile") == "original\n"
    assert not sbx.files.exists("/up/one.txt")

    # One part whose file name is another path: written where the URL
    # says, never where the part says.
    r = httpx.post(f"{url}/files", params=signed, files=[("file", ("/root/.profile", b"one part"))], timeout=30)
    assert r.status_code == 200, r.text
    assert [e["path"] for e in r.json()] == ["/up/one.txt"], r.json()
    assert sbx.files.read("/up/one.txt") == "one part"
    assert sbx.files.read("/root/.profile") == "original\n"

    # A signature over no path opens no upload (each part would name its
    # own).
    r = httpx.post(f"{url}/files", params={**_signed("", "write", token), "path": ""},
                   files=[("file", ("/root/.profile", b"echo owned"))], timeout=30)
    assert r.status_code == 400 and r.json()["message"].startswith("path"), r.text
    assert sbx.files.read("/root/.profile") == "original\n"

    # The SDK's own upload URL, as E2B documents its use (a multipart POST
    # of one file, named after the local file).
    upload = sbx.upload_url("/up/sdk.txt")
    r = httpx.post(upload, files={"file": ("local-name.txt", b"from the sdk url")}, timeout=30)
    assert r.status_code == 200, r.text
    assert sbx.files.read("/up/sdk.txt") == "from the sdk url"
    # And the SDK's own writes, one file and several.
    sbx.files.write("/up/w.txt", "w")
    sbx.files.write_files([{"path": "/up/m1.txt", "data": "1"}, {"path": "/up/m2.txt", "data": "2"}])
    assert (sbx.files.read("/up/m1.txt"), sbx.files.read("/up/m2.txt")) == ("1", "2")


def test_a_signatures_fields_cannot_be_run_together(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    url = e2b_server["url"]
    token = sbx._envd_access_token
    sbx.commands.run("mkdir -p /sig && echo kept > /sig/f")
    # A read URL for "/sig/f:write:" signs "/sig/f:write::read::TOKEN", the
    # same string as an upload to "/sig/f" by user ":read:".
    read_url = _signed("/sig/f:write:", "read", token)
    forged = {"path": "/sig/f", "username": ":read:", "signature": read_url["signature"]}
    r = httpx.post(f"{url}/files", params=forged, content=b"overwritten",
                   headers={"Content-Type": "application/octet-stream"}, timeout=30)
    assert r.status_code == 400 and r.json()["message"].startswith("username"), r.text
    assert sbx.files.read("/sig/f") == "kept\n"
    # A path with ':' in it is still a path a signature opens.
    sbx.files.write("/sig/a:b.txt", "colon")
    r = httpx.get(f"{url}/files", params=_signed("/sig/a:b.txt", "read", token), timeout=30)
    assert r.status_code == 200 and r.content == b"colon", r.text


def test_a_page_served_through_the_relay_may_post_to_itself(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    url = e2b_server["url"]
    _serve(sbx)
    host = sbx.get_host(8000)
    own = f"http://{host}"
    # What a browser sends for a same-origin form POST of that page.
    r = httpx.post(f"{url}/cgi-bin/echo", content=b"a=1",
                   headers={"Host": host, "Origin": own, "Sec-Fetch-Site": "same-origin",
                            "Content-Type": "application/x-www-form-urlencoded"}, timeout=30)
    assert r.status_code == 200 and r.text == "POST\na=1", (r.status_code, r.text)
    # Another site's page, or another port's of the same sandbox: refused.
    for origin in ("http://evil.test", f"http://{sbx.get_host(8001)}"):
        r = httpx.post(f"{url}/cgi-bin/echo", content=b"a=1", headers={"Host": host, "Origin": origin}, timeout=30)
        assert r.status_code == 403, (origin, r.text)
    # Its own origin opens the relay only, never envd's calls or the API.
    r = httpx.post(f"{url}/filesystem.Filesystem/ListDir", json={"path": "/"},
                   headers={"Host": host, "Origin": own, "E2b-Sandbox-Port": "49983",
                            "E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token},
                   timeout=30)
    assert r.status_code == 403, (r.status_code, r.text)
    before = len(Sandbox.list().next_items())
    r = httpx.post(f"{url}/sandboxes", json={"templateID": "base"},
                   headers={"Host": host, "Origin": own, "X-API-KEY": TOKEN}, timeout=30)
    # Relayed to the page's own server (busybox httpd refuses the method).
    assert "<HTML>" in r.text and "sandboxID" not in r.text, (r.status_code, r.text)
    assert len(Sandbox.list().next_items()) == before
    envd_host = f"49983-{sbx.sandbox_id}.{host.split('.', 1)[1]}"
    r = httpx.post(f"{url}/filesystem.Filesystem/ListDir", json={"path": "/"},
                   headers={"Host": envd_host, "Origin": f"http://{envd_host}",
                            "X-Access-Token": sbx._envd_access_token}, timeout=30)
    assert r.status_code == 403, r.text
