"""Stand-in for gateway.session.SessionSource."""

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class SessionSource:
    platform: Any
    chat_id: str
    chat_name: Optional[str] = None
    chat_type: str = "dm"
    user_id: Optional[str] = None
    user_name: Optional[str] = None
    thread_id: Optional[str] = None
