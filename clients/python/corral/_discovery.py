"""Finding the token of a local ``corral serve``.

A service without a configured token generates one at start and writes it,
with its URL, to ``server-<ip>-<port>.json`` (mode 0600) in its runtime
directory: ``$CORRAL_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/corral/servers``,
else ``~/.local/share/corral/runtime``. The file is removed at shutdown. For
a loopback URL, the client reads the token from there, so the default
configuration needs nothing set. A token is never read for a URL that is not
loopback: it would be sent to another machine.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from pathlib import Path
from typing import Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

__all__ = ["find_token", "runtime_dirs"]


def runtime_dirs() -> List[Path]:
    """Where local services write their token files, first match first."""
    dirs: List[Path] = []
    explicit = os.environ.get("CORRAL_RUNTIME_DIR")
    if explicit and os.path.isabs(explicit):
        dirs.append(Path(explicit))
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        dirs.append(Path(xdg) / "corral" / "servers")
    home = os.environ.get("HOME")
    if home and os.path.isabs(home):
        dirs.append(Path(home) / ".local" / "share" / "corral" / "runtime")
    return dirs


def _ip(host: str) -> Optional["ipaddress._BaseAddress"]:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def _files() -> Iterator[Tuple[Path, dict]]:
    """The token files this user owns (others are ignored: a file someone
    else could write is not a token to trust)."""
    uid = os.getuid()
    for d in runtime_dirs():
        try:
            entries = sorted(d.glob("server-*.json"))
        except OSError:
            continue
        for path in entries:
            try:
                st = path.stat()
                if st.st_uid != uid or not stat.S_ISREG(st.st_mode) or st.st_mode & 0o022:
                    continue
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and isinstance(data.get("token"), str) and data["token"]:
                yield path, data


def find_token(base_url: Optional[str] = None, uds: Optional[str] = None) -> Optional[str]:
    """The generated token of the local service at ``base_url`` (default
    ``$CORRAL_URL``, else ``http://127.0.0.1:7070``) or on the Unix socket
    ``uds``, from its token file; ``None`` when there is none (the service
    has a configured token, no token, or is not local).

    Over the Unix socket the socket's owner needs no token; the file's token
    is returned for a service that names that socket, for other users."""
    url = base_url or os.environ.get("CORRAL_URL") or "http://127.0.0.1:7070"
    if uds is None and url.startswith("unix://"):
        uds = url[len("unix://") :]
    if uds:
        want = os.path.realpath(uds)
        for _, data in _files():
            sock = data.get("unix_socket")
            if isinstance(sock, str) and os.path.realpath(sock) == want:
                return str(data["token"])
        return None
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if not _is_loopback(host):
        return None
    best: Optional[Tuple[int, str]] = None
    for _, data in _files():
        if data.get("port") != port:
            continue
        listen = str(data.get("listen", ""))
        listen_host = listen.rsplit(":", 1)[0] if ":" in listen else listen
        ip = _ip(listen_host)
        if ip is None:
            continue
        if listen_host.strip("[]") == host.strip("[]"):
            rank = 0
        elif ip.is_loopback:
            rank = 1
        elif ip.is_unspecified:
            rank = 2
        else:
            continue
        if best is None or rank < best[0]:
            best = (rank, str(data["token"]))
    return best[1] if best else None


class TokenSource:
    """The token a client sends: the one given, else ``$CORRAL_TOKEN``, else
    the local service's generated one. A generated token is read again after
    a 401, since a restarted service has a new one."""

    def __init__(self, token: Optional[str], base_url: Optional[str], uds: Optional[str]) -> None:
        self._where = (base_url, uds)
        self.discovered = False
        if token is not None:
            self.token: Optional[str] = token or None
        elif os.environ.get("CORRAL_TOKEN"):
            self.token = os.environ["CORRAL_TOKEN"]
        else:
            self.token = find_token(base_url, uds)
            self.discovered = True

    def refresh(self) -> bool:
        """Reads the token file again; True when it holds a different token."""
        if not self.discovered:
            return False
        new = find_token(*self._where)
        if new and new != self.token:
            self.token = new
            return True
        return False
