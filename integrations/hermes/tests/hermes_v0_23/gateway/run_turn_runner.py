"""The tests' own turn runner: what gateway.run_turn_runner_approval_notify and
gateway.run_turn_runner_approval_settle read of Hermes's TurnRunner (_ctx with the status
adapter, chat, session key, thread metadata and source; _schedule, which runs a coroutine
on the gateway's loop from the agent thread). Not modelled on one file of Hermes."""

import asyncio
from types import SimpleNamespace


class TurnRunner:
    def __init__(self, adapter, loop, chat_id: str, session_key: str, metadata=None, user_id=None):
        self._loop = loop
        self._ctx = SimpleNamespace(_status_adapter=adapter, _status_chat_id=chat_id, session_key=session_key,
                                    _status_thread_metadata=metadata, source=SimpleNamespace(user_id=user_id),
                                    _run_still_current=lambda: True)

    def _schedule(self, coro, what: str):
        return asyncio.run_coroutine_threadsafe(coro, self._loop)


def approval_notify(adapter, loop, chat_id: str, session_key: str, metadata=None):
    """The notify_cb a turn hands to the approval wait, bound to one chat."""
    from gateway.run_turn_runner_approval_notify import notify_approval
    runner = TurnRunner(adapter, loop, chat_id, session_key, metadata, user_id=chat_id)
    return lambda approval_data: notify_approval(runner, approval_data)
