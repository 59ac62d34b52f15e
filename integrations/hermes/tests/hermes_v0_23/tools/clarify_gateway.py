"""Stand-in for tools.clarify_gateway of Hermes Agent v0.23: entries registered by clarify_id with
multi_select (the runner passes it to register(), not to send_clarify), resolutions recorded, and
get_clarify_timeout's agent.clarify_timeout where 0 or less means no limit."""

import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional

calls: list = []
TIMEOUT = 3600  # agent.clarify_timeout


@dataclass
class _ClarifyEntry:
    clarify_id: str
    session_key: str
    question: str
    choices: Optional[List[str]]
    multi_select: bool = False
    event: threading.Event = field(default_factory=threading.Event)
    response: Optional[str] = None
    awaiting_text: bool = False


_lock = threading.RLock()
_entries: Dict[str, _ClarifyEntry] = {}


def register(clarify_id: str, session_key: str, question: str, choices: Optional[List[str]],
             multi_select: bool = False) -> _ClarifyEntry:
    entry = _ClarifyEntry(clarify_id=clarify_id, session_key=session_key, question=question,
                          choices=list(choices) if choices else None, multi_select=bool(multi_select),
                          awaiting_text=not bool(choices))
    with _lock:
        _entries[clarify_id] = entry
    return entry


def resolve_gateway_clarify(clarify_id: str, response: str) -> bool:
    calls.append(("resolve", clarify_id, response))
    return True


def mark_awaiting_text(clarify_id: str) -> bool:
    calls.append(("awaiting_text", clarify_id))
    return True


def get_clarify_timeout() -> int:
    """agent.clarify_timeout: 0 or less = unlimited (resolve_clarify_timeout keeps it verbatim)."""
    return int(TIMEOUT)
