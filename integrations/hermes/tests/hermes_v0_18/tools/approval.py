"""Stand-in for tools.approval of Hermes Agent v0.18.2 (7a43ab04): the
gateway approval queue, copied in what matters. resolve_gateway_approval
resolves the OLDEST pending approval of a session (no request ids, no
list_gateway_approvals). request() plays _await_gateway_decision: it queues
an approval, calls the notify callback and waits up to the timeout."""

import threading
import time
from typing import Optional

_lock = threading.Lock()
_gateway_queues: dict = {}  # session_key → [_ApprovalEntry, …]
TIMEOUT = 60  # approvals.timeout
calls: list = []  # (session_key, choice) of resolve_gateway_approval


class _ApprovalEntry:
    __slots__ = ("event", "data", "result", "reason")

    def __init__(self, data: dict):
        self.event = threading.Event()
        self.data = data
        self.result: Optional[str] = None
        self.reason: Optional[str] = None


def _get_approval_timeout() -> int:
    return int(TIMEOUT)


def resolve_gateway_approval(session_key: str, choice: str, resolve_all: bool = False,
                             reason: Optional[str] = None) -> int:
    calls.append((session_key, choice))
    with _lock:
        queue = _gateway_queues.get(session_key)
        if not queue:
            return 0
        if resolve_all:
            targets = list(queue)
            queue.clear()
        else:
            targets = [queue.pop(0)]
        if not queue:
            _gateway_queues.pop(session_key, None)
    for entry in targets:
        entry.result = choice
        if reason:
            entry.reason = reason
        entry.event.set()
    return len(targets)


def request(session_key: str, data: dict, notify, timeout: float) -> dict:
    """_await_gateway_decision: queue, notify, wait; the entry leaves the queue when the wait ends."""
    entry = _ApprovalEntry(data)
    with _lock:
        _gateway_queues.setdefault(session_key, []).append(entry)
    notify(data)
    resolved = entry.event.wait(timeout)
    with _lock:
        queue = _gateway_queues.get(session_key, [])
        if entry in queue:
            queue.remove(entry)
        if not queue:
            _gateway_queues.pop(session_key, None)
    return {"resolved": resolved, "choice": entry.result}


def waiting(session_key: str) -> int:
    with _lock:
        return len(_gateway_queues.get(session_key, []))
