"""Stand-in for hermes_cli.plugins: how Hermes finds, enables and imports a
user's directory plugin, copied from v0.18.2 (7a43ab04, PluginManager
._scan_directory, _get_enabled_plugins, _load_plugin, _load_directory_module,
PluginContext.register_platform) and v0.21.3 (00067189, the same in
hermes_cli/plugins_loader.py plus the requires_hermes gate of
plugins_manifest.py; unchanged in the newest plugins_manifest.py read,
which adds requires_hermes_error and running_hermes_version = hermes_cli.__version__).
VERSION is the Hermes version it stands for (hermes_cli.__version__: 0.0.0 in a
source build)."""

import importlib.util
import os
import re
import sys
import types
from pathlib import Path

import yaml

# Whether this line reads requires_hermes (0.18 does not); a source build of
# it reports VERSION 0.0.0 and is still gated.
READS_REQUIRES_HERMES = True
VERSION = "0.23.6"
_NS_PARENT = "hermes_plugins"


def get_hermes_home() -> Path:
    return Path(os.environ["HERMES_HOME"])


def _get_enabled_plugins():
    """config.yaml plugins.enabled; None when absent (nothing is enabled)."""
    path = get_hermes_home() / "config.yaml"
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except OSError:
        return None
    enabled = (cfg.get("plugins") or {}).get("enabled")
    return set(enabled) if isinstance(enabled, list) else None


def _version_tuple(v):
    parts = re.split(r"[-+]", str(v).strip().lstrip("v"), maxsplit=1)[0].split(".")
    parts += ["0"] * (3 - len(parts))
    try:
        return tuple(int(x) for x in parts[:3])
    except ValueError:
        return None


def version_satisfies(spec: str, current: str) -> bool:
    """plugins_manifest.version_satisfies of v0.21.3."""
    cur = _version_tuple(current)
    if cur is None:
        return True
    ops = {">=": cur.__ge__, "<=": cur.__le__, "==": cur.__eq__, "!=": cur.__ne__, ">": cur.__gt__, "<": cur.__lt__}
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.match(r"^\s*(>=|<=|==|!=|>|<)\s*(.+?)\s*$", clause)
        op, target = (m.group(1), m.group(2)) if m else (">=", clause)
        tgt = _version_tuple(target)
        if tgt is not None and not ops[op](tgt):
            return False
    return True


class PluginContext:
    def __init__(self, manifest: dict, manager: "PluginManager"):
        self.manifest = manifest
        self._manager = manager

    def register_platform(self, name, label, adapter_factory, check_fn, validate_config=None,
                          required_env=None, install_hint="", **entry_kwargs):
        """Extra keyword arguments go to PlatformEntry; unknown keys raise TypeError."""
        from gateway.platform_registry import PlatformEntry, platform_registry
        entry_kwargs.setdefault("plugin_name", self.manifest["name"])
        entry = PlatformEntry(name=name, label=label, adapter_factory=adapter_factory, check_fn=check_fn,
                              validate_config=validate_config, required_env=required_env or [],
                              install_hint=install_hint, source="plugin", **entry_kwargs)
        platform_registry.register(entry)


class PluginManager:
    def __init__(self):
        self.errors = {}  # plugin key → why it did not load
        self.loaded = {}  # plugin key → module

    def discover_and_load(self):
        """User plugins (~/.hermes/plugins/<name>/plugin.yaml), loaded when in plugins.enabled."""
        enabled = _get_enabled_plugins()
        root = get_hermes_home() / "plugins"
        for child in sorted(root.iterdir()) if root.is_dir() else []:
            manifest_file = child / "plugin.yaml"
            if not manifest_file.exists():
                continue
            data = yaml.safe_load(manifest_file.read_text(encoding="utf-8")) or {}
            manifest = dict(data, name=data.get("name", child.name), path=str(child))
            key = manifest["name"]
            if enabled is None or key not in enabled:
                self.errors[key] = f"not enabled in config (run `hermes plugins enable {key}` to activate)"
                continue
            self._load_plugin(manifest)

    def _load_plugin(self, manifest):
        key = manifest["name"]
        spec = str(manifest.get("requires_hermes") or "").strip()
        if READS_REQUIRES_HERMES and spec and not version_satisfies(spec, VERSION):
            self.errors[key] = f"requires hermes {spec}, running {VERSION}"
            return
        try:
            module = self._load_directory_module(manifest)
            register_fn = getattr(module, "register", None)
            if register_fn is None:
                self.errors[key] = "no register() function"
                return
            register_fn(PluginContext(manifest, self))
            self.loaded[key] = module
        except Exception as exc:
            self.errors[key] = str(exc)

    def _load_directory_module(self, manifest):
        plugin_dir = Path(manifest["path"])
        init_file = plugin_dir / "__init__.py"
        if not init_file.exists():
            raise FileNotFoundError(f"No __init__.py in {plugin_dir}")
        if _NS_PARENT not in sys.modules:
            ns_pkg = types.ModuleType(_NS_PARENT)
            ns_pkg.__path__ = []
            ns_pkg.__package__ = _NS_PARENT
            sys.modules[_NS_PARENT] = ns_pkg
        slug = manifest["name"].replace("/", "__").replace("-", "_")
        module_name = f"{_NS_PARENT}.{slug}"
        for name in [n for n in sys.modules if n == module_name or n.startswith(module_name + ".")]:
            del sys.modules[name]
        spec = importlib.util.spec_from_file_location(
            module_name, init_file, submodule_search_locations=[str(plugin_dir)])
        module = importlib.util.module_from_spec(spec)
        module.__package__ = module_name
        module.__path__ = [str(plugin_dir)]
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        return module
