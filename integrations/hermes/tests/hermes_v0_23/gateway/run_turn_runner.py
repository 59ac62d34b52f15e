"""Stand-in for the turn runner's approval notify of Hermes Agent v0.23
(gateway/run_turn_runner.py, TurnRunner._approval_notify_sync, and
gateway/run_turn_runner_approval_settle.py at efb968a7), in its order of calls:

1. adapter.send_exec_approval(chat_id=, command=, session_key=, description=, metadata=,
   allow_permanent=, allow_session=, smart_denied=), keywords only, awaited up to 15 s;
2. when sent: register_timeout_notice → tools.approval.register_gateway_settle(session_key,
   request_id, settle), which REPLACES any settle the adapter registered while sending;
3. that settle, on reason "timeout" only, edits the card (adapter.edit_message(chat_id,
   card_message_id, notice + command)) and, when the edit fails, sends the notice.

metadata carries approval_id (the request's id) as the issue reports of the newest release."""

import asyncio

TIMEOUT_NOTICE = "⏱ Approval timed out — the command did not run."
notices: list = []  # (how, chat_id, message_id or None, text)


def approval_notify(adapter, loop, chat_id: str, session_key: str, metadata=None):
    """The notify_cb the runner hands to the approval wait, bound to one chat."""
    def notify(approval_data: dict) -> None:
        from tools.approval import register_gateway_settle
        cmd = approval_data.get("command", "")
        desc = approval_data.get("description", "dangerous command")
        flags = {k: approval_data.get(k, d) for k, d in
                 (("allow_permanent", True), ("allow_session", True), ("smart_denied", False))}
        meta = dict(metadata or {}, approval_id=approval_data.get("request_id"))
        fut = asyncio.run_coroutine_threadsafe(adapter.send_exec_approval(
            chat_id=chat_id, command=cmd, session_key=session_key, description=desc, metadata=meta,
            **flags), loop)
        result = fut.result(15)
        if not getattr(result, "success", False):
            raise RuntimeError("send_exec_approval failed: " + str(getattr(result, "error", "")))
        card_id = getattr(result, "message_id", None)

        def settle(reason: str) -> None:
            if reason != "timeout":
                return
            asyncio.run_coroutine_threadsafe(_post_timeout_notice(adapter, chat_id, card_id, cmd), loop)
        register_gateway_settle(session_key, approval_data.get("request_id"), settle)
    return notify


async def _post_timeout_notice(adapter, chat_id, card_id, command):
    if card_id:
        res = await adapter.edit_message(chat_id, card_id, f"{TIMEOUT_NOTICE}\n```\n{command}\n```")
        if getattr(res, "success", False):
            notices.append(("edit", chat_id, card_id, TIMEOUT_NOTICE))
            return
    await adapter.send(chat_id, TIMEOUT_NOTICE)
    notices.append(("send", chat_id, None, TIMEOUT_NOTICE))
