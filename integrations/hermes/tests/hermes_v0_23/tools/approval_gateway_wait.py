"""Stand-in for tools.approval_gateway_wait of Hermes Agent's newest line, modelled on
NousResearch/hermes-agent tools/approval_gateway_wait.py at 04eef15a (stored version; no
release tag could be tied to it). Written for these tests from that file's behaviour, not
copied:

- an entry's approval_id is its request_id; its data carries both and expires_at, a
  time.monotonic() deadline of approvals.timeout;
- identical concurrent approvals (same command and pattern_keys) are coalesced: a second
  one is no new entry and no notify, it waits on the first (the leader) and adopts its
  session / always / deny / timeout; a leader's "once" covers only the leader, so the
  follower then asks afresh;
- a wait woken with no choice (withdraw_gateway_approval, clear_session, a turn that
  ended) returns {"resolved": True, "choice": None, "reason": None, "cancelled": cause}:
  a withdrawal, which Hermes reports as withdrawn before the user answered and fails
  closed on, never a user's deny; a timeout is {"resolved": False, "choice": None, ...};
- a notify that raises leaves the queue and returns {"resolved": False, "choice": None,
  "notify_failed": True};
- the entry's settle(reason) runs once when the wait ends: "resolved", "timeout",
  "session_closed" (woken with no choice) or "notify_failed".

Interrupts (/stop) and the human-wait heartbeats are not modelled."""

import time
import threading
import uuid

from tools import approval_context as _ctx


class _ApprovalEntry:
    __slots__ = ("approval_id", "event", "data", "result", "reason", "acknowledged", "settle", "cancelled",
                 "expires_at")

    def __init__(self, data: dict):
        self.event = threading.Event()
        self.data = dict(data)
        self.approval_id = str(self.data.get("approval_id") or self.data.get("request_id") or uuid.uuid4().hex)
        self.data["approval_id"] = self.approval_id
        self.data.setdefault("request_id", self.approval_id)
        self.acknowledged = False
        self.settle = None
        self.result = None
        self.expires_at = time.monotonic() + max(_ctx._get_approval_timeout(), 0)
        self.data["expires_at"] = self.expires_at
        self.reason = None
        self.cancelled = None


def _poll_event(event: threading.Event, expires_at: float) -> str:
    """"set" or "timeout"."""
    while True:
        left = expires_at - time.monotonic()
        if left <= 0:
            return "timeout"
        if event.wait(timeout=min(1.0, left)):
            return "set"


def _cancel_cause(state: str, entry):
    if state == "set" and entry.result is None:
        return entry.cancelled or "the turn ended before the prompt was answered"
    return None


def _finish(resolved: bool, choice, reason, **extra) -> dict:
    return {"resolved": resolved, "choice": choice, "reason": reason, **extra}


def _await_coalesced_leader(session_key: str, leader):
    state = _poll_event(leader.event, leader.expires_at)
    cancelled = _cancel_cause(state, leader)
    if state == "timeout":
        choice, resolved = None, False
    else:
        choice = leader.result
        resolved = choice is not None
    if choice == "once":
        return None  # once covers the leader only: ask afresh
    extra = {"cancelled": cancelled} if cancelled else {}
    return _finish(resolved, choice, leader.reason, coalesced=True, **extra)


def _await_gateway_decision(session_key: str, notify_cb, approval_data: dict, *, surface: str = "gateway") -> dict:
    from tools import approval as _approval

    keys = list(approval_data.get("pattern_keys") or [])
    with _approval._lock:
        leader = next((e for e in _approval._gateway_queues.get(session_key, [])
                       if e.data.get("command") == approval_data.get("command")
                       and list(e.data.get("pattern_keys") or []) == keys), None)
    if leader is not None:
        adopted = _await_coalesced_leader(session_key, leader)
        if adopted is not None:
            return adopted

    entry = _ApprovalEntry(approval_data)
    with _approval._lock:
        _approval._gateway_queues.setdefault(session_key, []).append(entry)

    def drop(state: str, outcome=None):
        with _approval._lock:
            choice = entry.result
            queue = _approval._gateway_queues.get(session_key, [])
            if entry in queue:
                queue.remove(entry)
            if not queue:
                _approval._gateway_queues.pop(session_key, None)
            if outcome and (session_key, entry.approval_id) not in _approval._gateway_resolution_outcomes:
                _approval._record_gateway_resolution_locked(session_key, entry, outcome)
            settle, entry.settle = entry.settle, None
        if settle is not None:
            reason = ("resolved" if choice is not None else "session_closed") if state == "set" else state
            try:
                settle(reason)
            except Exception:
                pass
        return choice

    try:
        notify_cb(dict(entry.data))
    except Exception:
        drop("notify_failed", "notify_failed")
        return {"resolved": False, "choice": None, "notify_failed": True}

    state = _poll_event(entry.event, entry.expires_at)
    cancelled = _cancel_cause(state, entry)
    choice = drop(state, entry.result or ("expired" if state == "timeout" else None))
    resolved = state != "timeout" or choice is not None
    extra = {"cancelled": cancelled} if cancelled else {}
    return _finish(resolved, choice, entry.reason, **extra)
