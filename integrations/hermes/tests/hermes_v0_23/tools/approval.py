"""Stand-in for tools.approval of Hermes Agent's newest line: the gateway approval queue,
modelled on NousResearch/hermes-agent tools/approval.py at 04eef15a (stored version; no
release tag could be tied to it), whose blocking wait is tools/approval_gateway_wait.py of
the same commit. (The 544ac55e version of tools/approval.py, named before, is an early
file without this queue.) Written for these tests from that file's behaviour, not copied:

- resolve_gateway_approval(session_key, choice, resolve_all=False, reason=None,
  request_id=None, approval_id=None): first drops entries past their expires_at, then
  resolves the one whose approval_id or request_id matches, else with resolve_all every
  one, else the OLDEST; returns how many;
- withdraw_gateway_approval(session_key, request_id, cause): the waiter wakes with
  cancelled=cause, no choice: a withdrawal, never a user deny;
- list_gateway_approvals: copies of the pending entries' data (request_id, approval_id,
  expires_at, command, description, ...);
- register_gateway_settle keeps ONE settle per request: a later registration replaces
  the earlier (the turn runner registers its timeout notice after the card is sent);
- clear_session / unregister_gateway_notify wake every waiter of the session with no
  choice.

calls, settles, request() and waiting() are the tests' own."""

import threading
import time
from typing import Optional

from tools.approval_gateway_wait import _ApprovalEntry, _await_gateway_decision  # noqa: F401

_lock = threading.Lock()
_gateway_queues: dict = {}
_gateway_notify_cbs: dict = {}
_gateway_resolution_outcomes: dict = {}
_MAX_GATEWAY_RESOLUTION_OUTCOMES = 1024

calls: list = []  # (session_key, choice, request_id), ("withdraw", session_key, request_id, cause)
settles: list = []  # request ids given a settle callback


def _record_gateway_resolution_locked(session_key: str, entry, outcome: str) -> None:
    key = (session_key, entry.approval_id)
    _gateway_resolution_outcomes.pop(key, None)
    _gateway_resolution_outcomes[key] = outcome
    while len(_gateway_resolution_outcomes) > _MAX_GATEWAY_RESOLUTION_OUTCOMES:
        _gateway_resolution_outcomes.pop(next(iter(_gateway_resolution_outcomes)))


def register_gateway_notify(session_key: str, cb) -> None:
    with _lock:
        _gateway_notify_cbs[session_key] = cb


def unregister_gateway_notify(session_key: str) -> None:
    with _lock:
        _gateway_notify_cbs.pop(session_key, None)
        for entry in _gateway_queues.pop(session_key, []):
            _record_gateway_resolution_locked(session_key, entry, "expired")
            entry.event.set()


def resolve_gateway_approval(session_key: str, choice: str, resolve_all: bool = False,
                             reason: Optional[str] = None, request_id: Optional[str] = None,
                             approval_id: Optional[str] = None) -> int:
    calls.append((session_key, choice, request_id or approval_id))
    target = approval_id or request_id
    with _lock:
        queue = _gateway_queues.get(session_key, [])
        for entry in list(queue):
            if time.monotonic() >= entry.expires_at:
                queue.remove(entry)
                _record_gateway_resolution_locked(session_key, entry, "expired")
                entry.event.set()
        if not queue:
            _gateway_queues.pop(session_key, None)
            return 0
        if target:
            targets = [e for e in queue if target in (e.approval_id, e.data.get("request_id"))]
            if not targets:
                return 0
            queue[:] = [e for e in queue if e not in targets]
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
            _record_gateway_resolution_locked(session_key, entry, choice)
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
    settles.append(request_id)
    with _lock:
        for entry in _gateway_queues.get(session_key, []):
            if entry.data.get("request_id") == request_id:
                entry.settle = settle
                return True
    return False


def clear_session(session_key: str) -> None:
    with _lock:
        for entry in _gateway_queues.pop(session_key, []):
            entry.cancelled = "the session ended before the prompt was answered"
            _record_gateway_resolution_locked(session_key, entry, "expired")
            entry.event.set()


def request(session_key: str, data: dict, notify, timeout: Optional[float] = None) -> dict:
    """An agent thread's approval wait, as the command guard runs it
    (_await_gateway_decision); timeout is this wait's approvals.timeout."""
    from tools import approval_context
    with approval_context.per_thread(timeout):
        return _await_gateway_decision(session_key, notify, dict(data))


def waiting(session_key: str) -> int:
    with _lock:
        return len(_gateway_queues.get(session_key, []))
