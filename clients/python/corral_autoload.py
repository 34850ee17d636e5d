"""The startup hook of corral's open-instruct switch (``$CORRAL_OPEN_INSTRUCT``)
and of its hermes-agent backend (``$TERMINAL_ENV=corral``).

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

With ``$TERMINAL_ENV`` set to ``corral`` (hermes-agent's terminal backend,
``TERMINAL_ENV=corral hermes``) it does the same for hermes'
``tools.terminal_tool``: right after that module runs,
:func:`corral.adapters.hermes.install` makes ``corral`` one of its backends.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, Optional

#: The switch: ``1`` makes open-instruct's ``create_backend`` give corral's
#: backend in every process of the environment.
ENV = "CORRAL_OPEN_INSTRUCT"
#: The module whose ``create_backend`` is replaced.
TARGET = "open_instruct.environments.backends"

#: hermes-agent's backend switch, and the value that names corral.
HERMES_ENV = "TERMINAL_ENV"
HERMES_BACKEND = "corral"
#: hermes' module whose environment factory gets the ``corral`` backend.
HERMES_TARGET = "tools.terminal_tool"

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


def hermes_requested(environ: Any = None) -> bool:
    """Whether ``$TERMINAL_ENV`` names corral as hermes' terminal backend."""
    raw = (os.environ if environ is None else environ).get(HERMES_ENV, "")
    return raw.strip().lower() == HERMES_BACKEND


def _switch_hermes(module: Any) -> None:
    try:
        from corral.adapters.hermes import install
    except Exception as err:  # noqa: BLE001 - reported, never fatal at import
        _warn(
            "$%s=%s asks for corral, but corral.adapters.hermes cannot be imported here (%s: %s): "
            "hermes will not know the backend",
            HERMES_ENV,
            HERMES_BACKEND,
            type(err).__name__,
            err,
        )
        return
    install()


def _switch_open_instruct(module: Any) -> None:
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


def _warn(msg: str, *args: Any) -> None:
    import logging

    logging.getLogger("corral.adapters").warning("corral: " + msg, *args)


class _Loader:
    """The module's own loader, then the switch."""

    def __init__(self, inner: Any, switch: Callable[[Any], None]) -> None:
        self._inner = inner
        self._switch = switch

    def create_module(self, spec: Any) -> Optional[Any]:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        self._switch(module)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, ...: the module's own loader answers.
        return getattr(self._inner, name)


class Finder:
    """Finds the modules to switch (:data:`TARGET`, :data:`HERMES_TARGET`,
    as asked for) through the other finders and wraps their loaders."""

    def __init__(self) -> None:
        self.switches: Dict[str, Callable[[Any], None]] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[Any]:
        switch = self.switches.get(fullname)
        if switch is None:
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
            spec.loader = _Loader(spec.loader, switch)
        return spec


def _finder() -> Finder:
    for f in sys.meta_path:
        if isinstance(f, Finder):
            return f
    finder = Finder()
    sys.meta_path.insert(0, finder)
    return finder


def _arm(target: str, switch: Callable[[Any], None]) -> None:
    """Switch ``target`` right after it is imported, or at once if it is."""
    module = sys.modules.get(target)
    if module is not None:
        switch(module)
        return
    _finder().switches[target] = switch


def activate() -> None:
    """The open-instruct switch: put the finder first on ``sys.meta_path``
    (once), or switch the module at once if it is already imported."""
    _arm(TARGET, _switch_open_instruct)


def activate_hermes() -> None:
    """The hermes backend: :func:`corral.adapters.hermes.install` right after
    ``tools.terminal_tool`` is imported (or at once if it is)."""
    _arm(HERMES_TARGET, _switch_hermes)


if requested():
    activate()
if hermes_requested():
    activate_hermes()
