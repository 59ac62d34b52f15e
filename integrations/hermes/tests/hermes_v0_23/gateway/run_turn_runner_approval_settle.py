"""Stand-in for gateway.run_turn_runner_approval_settle of Hermes Agent's newest line,
modelled on NousResearch/hermes-agent gateway/run_turn_runner_approval_settle.py at
145695804 (and at efb968a7 before it; neither stored version could be tied to a release
tag). Written for these tests from that file's behaviour, not copied:

register_timeout_notice(runner, approval_data, command=, card_message_id=) registers, after
the card was sent, a settle hook for the request (tools.approval.register_gateway_settle,
which REPLACES a hook the adapter registered while sending). On reason "timeout" only, and
while the run is still current, it posts the notice:
- 145695804: when the adapter's class has retire_exec_approval_card, it is called as
  retire(adapter, chat_id, card_message_id) (a failure is logged) and the notice is then
  sent as a message of its own (the card is kept as the record of what was asked);
- without it (and at efb968a7): the card is edited to "notice + command"; when the edit
  fails the notice is sent.

notices records what was done, for the tests."""

import logging
from typing import Optional

from gateway.platforms.base_exec_approval import approval_timeout_seconds, format_approval_timed_out_notice

logger = logging.getLogger(__name__)
notices: list = []  # (how, chat_id, card id or None, text)


def register_timeout_notice(runner, approval_data: dict, *, command: str, card_message_id: Optional[str]) -> None:
    from tools.approval import register_gateway_settle

    request_id = approval_data.get("request_id")
    session_key = runner._ctx.session_key or ""
    if not request_id or not session_key:
        return
    timeout_s = approval_timeout_seconds()

    def settle(reason: str) -> None:
        if reason != "timeout":
            return
        still_current = getattr(runner._ctx, "_run_still_current", None)
        if callable(still_current) and not still_current():
            return
        runner._schedule(_post_timeout_notice(runner._ctx, command, card_message_id, timeout_s),
                         "Approval timeout notice scheduling error")

    register_gateway_settle(session_key, request_id, settle)


async def _post_timeout_notice(ctx, command: str, card_message_id: Optional[str], timeout_s: int) -> None:
    adapter, chat_id = ctx._status_adapter, ctx._status_chat_id
    notice = format_approval_timed_out_notice(timeout_s)
    try:
        retire = getattr(type(adapter), "retire_exec_approval_card", None)
        if card_message_id and callable(retire):
            try:
                await retire(adapter, chat_id, card_message_id)
                notices.append(("retire", chat_id, card_message_id, notice))
            except Exception:
                logger.warning("Could not retire expired approval buttons", exc_info=True)
        elif card_message_id:
            result = await adapter.edit_message(chat_id, card_message_id, f"{notice}\n```\n{command}\n```")
            if getattr(result, "success", False):
                notices.append(("edit", chat_id, card_message_id, notice))
                return
        await adapter.send(chat_id, notice, metadata={"notify": True})
        notices.append(("send", chat_id, None, notice))
    except Exception:
        logger.debug("Approval timeout notice failed", exc_info=True)
