"""Hatchling build hook: writes corral/client.py (the synchronous client)
from corral/aio.py with tools/unasync.py before every build, editable
installs included, so a wheel or `pip install -e` always has it current."""

import importlib.util
from pathlib import Path
from typing import Any, Dict

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class UnasyncHook(BuildHookInterface):
    PLUGIN_NAME = "unasync"

    def initialize(self, version: str, build_data: Dict[str, Any]) -> None:
        path = Path(self.root) / "tools" / "unasync.py"
        spec = importlib.util.spec_from_file_location("corral_unasync", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.write()
