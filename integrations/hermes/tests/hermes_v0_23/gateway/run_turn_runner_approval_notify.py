"""Stand-in for gateway.run_turn_runner_approval_notify of Hermes Agent's newest line,
modelled on NousResearch/hermes-agent gateway/run_turn_runner_approval_notify.py at
04eef15a (stored version; no release tag could be tied to it) and its metadata builder
(_exec_approval_metadata there; _build_exec_approval_metadata in gateway/approval_bridge.py
of later versions). Written for these tests from that file's behaviour, not copied.

notify_approval(runner, approval_data), the notify_cb of the approval wait, runs in the
agent thread:
- the description is approval_data's, else the localized ea_default_reason_text();
- an adapter that renders buttons gets send_exec_approval(chat_id=, command=,
  session_key=, description=, metadata=, allow_permanent=, allow_session=, smart_denied=)
  by keyword, awaited up to 15 s; metadata is the thread's metadata with
  requester_user_id, approval_id (the request's id) and expires_at (the wait's
  time.monotonic() deadline);
- sent: register_timeout_notice(runner, approval_data, command=, card_message_id=the
  result's message_id); a send that timed out counts as possibly delivered (no re-send);
- else the plain-text prompt, and its timeout notice without a card.
(gateway.run's _approval_send_outcome, _redact_approval_command and the text prompt's
wording are approximated.)"""

import concurrent.futures

from gateway.platforms.base_exec_approval import ea_default_reason_text


def _renders_exec_approval_buttons(adapter_cls: type) -> bool:
    probe = getattr(adapter_cls, "supports_exec_approval_buttons", None)
    if callable(probe):
        return bool(probe())
    return getattr(adapter_cls, "send_exec_approval", None) is not None


def _exec_approval_metadata(base, approval_data: dict) -> dict:
    metadata = dict(base or {})
    approval_id = str(approval_data.get("approval_id") or "")
    if approval_id:
        metadata["approval_id"] = approval_id
    if "expires_at" in approval_data:
        metadata["expires_at"] = approval_data["expires_at"]
    return metadata


def _approval_send_outcome(fut, timeout: float) -> str:
    try:
        result = fut.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        return "ambiguous"
    return "sent" if getattr(result, "success", False) else "failed"


def notify_approval(self, approval_data: dict) -> None:
    from gateway.run_turn_runner_approval_settle import register_timeout_notice
    ctx = self._ctx
    adapter = ctx._status_adapter
    adapter.pause_typing_for_chat(ctx._status_chat_id)
    cmd = str(approval_data.get("command", ""))
    desc = approval_data.get("description") or ea_default_reason_text()
    flags = {k: approval_data.get(k, d) for k, d in
             (("allow_permanent", True), ("allow_session", True), ("smart_denied", False))}
    if _renders_exec_approval_buttons(type(adapter)):
        fut = self._schedule(adapter.send_exec_approval(
            chat_id=ctx._status_chat_id, command=cmd, session_key=ctx.session_key or "", description=desc,
            metadata=_exec_approval_metadata(
                {**(ctx._status_thread_metadata or {}), "requester_user_id": ctx.source.user_id}, approval_data),
            **flags), "send_exec_approval scheduling error")
        outcome = _approval_send_outcome(fut, timeout=15)
        if outcome == "sent":
            register_timeout_notice(self, approval_data, command=cmd,
                                    card_message_id=getattr(fut.result(timeout=0), "message_id", None))
            return
        if outcome == "ambiguous":
            return
    msg = f"⚠️ Hermes wants to run a command that needs your OK\n```\n{cmd}\n```\nWhy it was flagged: {desc}"
    fut = self._schedule(adapter.send(ctx._status_chat_id, msg, metadata={"is_approval_prompt": True}),
                         "Approval text-send scheduling error")
    result = fut.result(timeout=15)
    if result is not None and getattr(result, "success", True) is False:
        raise RuntimeError(str(getattr(result, "error", "") or "approval fallback send failed"))
    register_timeout_notice(self, approval_data, command=cmd, card_message_id=None)
