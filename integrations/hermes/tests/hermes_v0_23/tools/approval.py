"""Stand-in for tools.approval of Hermes Agent v0.23 (tools/approval.py at 544ac55e): the gateway
approval queue with request ids, resolve_gateway_approval (the matching request_id, else the OLDEST),
withdraw_gateway_approval (the waiter wakes with cancelled=cause: a withdrawal, never a user deny),
list_gateway_approvals, and register_gateway_settle, which keeps ONE settle per request: a later
registration replaces the earlier. request() plays approval_gateway_wait._await_gateway_decision."""

import threading
import uuid
from typing import Optional

_lock = threading.Lock()
_gateway_queues: dict = {}
calls: list = []  # (session_key, choice, request_id), ("withdraw", session_key, request_id, cause)


class _ApprovalEntry:
    __slots__ = ("event", "data", "result", "reason", "settle", "acknowledged", "cancelled")

    def __init__(self, data: dict):
        self.event = threading.Event()
        self.data = data
        self.result: Optional[str] = None
        self.reason = self.settle = self.cancelled = None
        self.acknowledged = False


def resolve_gateway_approval(session_key: str, choice: str, resolve_all: bool = False,
                             reason: Optional[str] = None, request_id: Optional[str] = None) -> int:
    calls.append((session_key, choice, request_id))
    with _lock:
        queue = _gateway_queues.get(session_key)
        if not queue:
            return 0
        if request_id:
            targets = [entry for entry in queue if entry.data.get("request_id") == request_id]
            if not targets:
                return 0
            queue[:] = [entry for entry in queue if entry not in targets]
        elif resolve_all:
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


def withdraw_gateway_approval(session_key: str, request_id: str, cause: str) -> bool:
    calls.append(("withdraw", session_key, request_id, cause))
    with _lock:
        queue = _gateway_queues.get(session_key, [])
        entry = next((e for e in queue if e.data.get("request_id") == request_id), None)
        if entry is None:
            return False
        queue.remove(entry)
        if not queue:
            _gateway_queues.pop(session_key, None)
        entry.cancelled = cause
        entry.event.set()
    return True


def list_gateway_approvals(session_key: str) -> list:
    with _lock:
        return [dict(entry.data) for entry in _gateway_queues.get(session_key, [])]


def register_gateway_settle(session_key: str, request_id: str, settle) -> bool:
    """Attach settle(reason), run once when that wait ends by any path; False when not pending."""
    settles.append(request_id)
    with _lock:
        for entry in _gateway_queues.get(session_key, []):
            if entry.data.get("request_id") == request_id:
                entry.settle = settle
                return True
    return False


settles: list = []  # request ids given a settle callback


def request(session_key: str, data: dict, notify, timeout: float) -> dict:
    data = dict(data, request_id=uuid.uuid4().hex)
    entry = _ApprovalEntry(data)
    with _lock:
        _gateway_queues.setdefault(session_key, []).append(entry)
    try:
        notify(dict(data))
    except Exception:
        withdraw_gateway_approval(session_key, data["request_id"], "notify_failed")
        return {"resolved": False, "choice": None, "notify_failed": True}
    resolved = entry.event.wait(timeout)
    with _lock:
        queue = _gateway_queues.get(session_key, [])
        if entry in queue:
            queue.remove(entry)
        if not queue:
            _gateway_queues.pop(session_key, None)
    reason = "timeout" if not resolved else ("cancelled" if entry.cancelled else "resolved")
    if entry.settle is not None:
        entry.settle(reason)
    out = {"resolved": resolved and not entry.cancelled, "choice": entry.result}
    if entry.cancelled:
        out["cancelled"] = entry.cancelled
    return out


def waiting(session_key: str) -> int:
    with _lock:
        return len(_gateway_queues.get(session_key, []))
