"""Stand-in for gateway.platform_registry of Hermes Agent v0.21.3 (00067189):
PlatformEntry with exactly that version's fields (ensure_deps_fn,
parse_target_ref_fn, validate_target_ref_fn, send_message_handler are new),
and the registry's create_adapter."""

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional


@dataclass
class PlatformEntry:
    name: str
    label: str
    adapter_factory: Callable[[Any], Any]
    check_fn: Callable[[], bool]
    validate_config: Optional[Callable[[Any], bool]] = None
    ensure_deps_fn: Optional[Callable[[], bool]] = None
    is_connected: Optional[Callable[[Any], bool]] = None
    required_env: list = field(default_factory=list)
    install_hint: str = ""
    setup_fn: Optional[Callable[[], None]] = None
    source: str = "plugin"
    plugin_name: str = ""
    allowed_users_env: str = ""
    allow_all_env: str = ""
    max_message_length: int = 0
    pii_safe: bool = False
    emoji: str = "🔌"
    allow_update_command: bool = True
    platform_hint: str = ""
    env_enablement_fn: Optional[Callable[[], Optional[dict]]] = None
    apply_yaml_config_fn: Optional[Callable[[dict, dict], Optional[dict]]] = None
    cron_deliver_env_var: str = ""
    parse_target_ref_fn: Optional[Callable[[str], Optional[tuple]]] = None
    validate_target_ref_fn: Optional[Callable[[str], Any]] = None
    send_message_handler: Optional[Callable[[dict, str, str, Any], Any]] = None
    standalone_sender_fn: Optional[Callable[..., Awaitable[dict]]] = None


class PlatformRegistry:
    def __init__(self):
        self._entries = {}

    def register(self, entry: PlatformEntry) -> None:
        self._entries[entry.name] = entry

    def get(self, name: str) -> Optional[PlatformEntry]:
        return self._entries.get(name)

    def unregister(self, name: str) -> bool:
        return self._entries.pop(name, None) is not None

    def create_adapter(self, name: str, config: Any):
        """None when missing, when check_fn fails or validate_config refuses, as Hermes does."""
        entry = self._entries.get(name)
        if entry is None or not entry.check_fn():
            return None
        if entry.validate_config is not None and not entry.validate_config(config):
            return None
        return entry.adapter_factory(config)

    def connected(self, name: str, config: Any) -> bool:
        """GatewayConfig.get_connected_platforms for a plugin platform: is_connected, else check_fn alone."""
        entry = self._entries[name]
        return bool(entry.is_connected(config)) if entry.is_connected else bool(entry.check_fn())


platform_registry = PlatformRegistry()
