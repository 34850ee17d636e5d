"""A process of its own that removes an adapter process's sandboxes when that
process ends however it ends: SIGKILL, ``os._exit``, a Ray worker that its
raylet quick-exits when the driver (the launcher) is signalled. No handler
runs in the dying process then; the kernel closes its pipe to the guardian,
and the guardian deletes what was still registered, within a second.

:mod:`corral.adapters._reaper` starts one guardian per process at the first
sandbox it tracks and tells it of every sandbox registered (``+``) and
released (``-``), a JSON line each on the guardian's stdin. The guardian
leaves the process's tree (a new session, and a second fork so that it is
nobody's child: Ray kills the children of a worker it ends, and a launcher's
process group gets its signals) and waits for end of file.

Its output goes nowhere: it must not hold the pipes of whoever runs the
adapter process (``subprocess.run(capture_output=True)`` would wait for it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Dict, Optional, Tuple


def main() -> None:
    # Not a terminal's or a launcher's to stop: only end of file ends it.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    live: Dict[str, Tuple[Optional[str], Optional[str]]] = {}
    for line in sys.stdin:
        try:
            op, entry = line[0], json.loads(line[1:])
            key = str(entry["id"])
        except (IndexError, ValueError, KeyError, TypeError):
            continue
        if op == "+":
            live[key] = (entry.get("url"), entry.get("token"))
        elif op == "-":
            live.pop(key, None)
    if not live:
        return
    from ..client import Client

    clients: Dict[Tuple[Optional[str], Optional[str]], Client] = {}
    for sandbox_id, (url, token) in live.items():
        try:
            client = clients.get((url, token))
            if client is None:
                client = clients[(url, token)] = Client(url, token=token)
            client.delete_sandbox(sandbox_id)
        except Exception:  # noqa: BLE001 - best effort: gone, or no service
            pass
    for client in clients.values():
        try:
            client.close()
        except Exception:  # noqa: BLE001
            pass


#: What the guardian runs: leave the starter's tree first (the intermediate
#: exits at once and its parent reaps it), then import and wait.
BOOT = (
    "import os\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "from corral.adapters._guardian import main\n"
    "main()\n"
)
