"""Stand-in for gateway.config: Platform and PlatformConfig."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional


class Platform:
    """A platform name; Hermes's enum accepts plugin names the same way."""

    def __init__(self, value: str):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Platform) and other.value == self.value

    def __hash__(self):
        return hash(self.value)


@dataclass
class PlatformConfig:
    enabled: bool = True
    token: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)
