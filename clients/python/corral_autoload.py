"""The startup hook of corral's open-instruct switch (``$CORRAL_OPEN_INSTRUCT``).

``corral_autoload.pth``, which the client's wheel installs into
site-packages, imports this module while ``site`` starts any Python process
of that environment in which ``$CORRAL_OPEN_INSTRUCT`` is set (and not
``0``): the launcher's, ``uv run``'s, every Ray worker's, whoever started
it. Ray under ``uv run`` starts its workers with uv's runtime-env hook and
never reads ``RAY_RUNTIME_ENV_HOOK``; ``site`` runs in all of them.

It runs before anything else, so it stays cheap: it puts one finder on
``sys.meta_path`` and imports nothing of corral (whose import costs a third
of a second) until open-instruct's ``open_instruct.environments.backends``
is imported. Right after that module runs, its ``create_backend`` is
replaced (:func:`corral.adapters.open_instruct.switch_module`), before
``open_instruct.environments`` or ``generic_sandbox`` copy the name with
``from .backends import create_backend``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

#: The switch: ``1`` makes open-instruct's ``create_backend`` give corral's
#: backend in every process of the environment.
ENV = "CORRAL_OPEN_INSTRUCT"
#: The module whose ``create_backend`` is replaced.
TARGET = "open_instruct.environments.backends"

_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def requested(environ: Any = None) -> bool:
    """Whether ``$CORRAL_OPEN_INSTRUCT`` asks for corral. A value that is
    neither on nor off is logged (naming it) and counts as off."""
    raw = (os.environ if environ is None else environ).get(ENV, "")
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value not in _OFF:
        _warn(
            "$%s=%r is not one of %s (on) or 0, false, no, off (off): open-instruct's backends stay its own "
            "(plain Docker)",
            ENV,
            raw,
            ", ".join(_ON),
        )
    return False


def _warn(msg: str, *args: Any) -> None:
    import logging

    logging.getLogger("corral.adapters").warning("corral: " + msg, *args)


class _Loader:
    """The module's own loader, then the switch."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> Optional[Any]:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        # Failing to switch is open-instruct's layout or this environment
        # (corral not importable): say why, and let open-instruct run.
        try:
            from corral.adapters.open_instruct import switch_module
        except Exception as err:  # noqa: BLE001 - reported, never fatal at import
            _warn(
                "$%s asks for corral, but corral.adapters.open_instruct cannot be imported here (%s: %s): "
                "open-instruct's backends stay its own (plain Docker)",
                ENV,
                type(err).__name__,
                err,
            )
            return
        switch_module(module, why=f"${ENV}")

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, ...: the module's own loader answers.
        return getattr(self._inner, name)


class Finder:
    """Finds :data:`TARGET` through the other finders and wraps its loader."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[Any]:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec


def activate() -> None:
    """Put the finder first on ``sys.meta_path`` (once), or switch the module
    at once if it is already imported."""
    if any(isinstance(f, Finder) for f in sys.meta_path):
        return
    module = sys.modules.get(TARGET)
    if module is not None:
        from corral.adapters.open_instruct import switch_module

        switch_module(module, why=f"${ENV}")
        return
    sys.meta_path.insert(0, Finder())


if requested():
    activate()
