"""Cards: approvals, slash confirmations and clarify questions, answered on
the phone and resolved with Hermes's own resolvers."""

import asyncio

from conftest import NEWEST, Hermes, Phone, decided, device_id, run, set_hermes_waits


async def answered(calls, n, timeout=10.0):
    """Waits until calls has at least n entries."""
    for _ in range(int(timeout / 0.05)):
        if len(calls) >= n:
            return calls
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {n} calls, got {calls}")


def test_cards_resolve_with_hermes_resolvers(tmp_path):
    async def main():
        from tools import approval, clarify_gateway, slash_confirm

        dev = device_id("card")
        hermes = await Hermes(tmp_path).start()
        a = hermes.adapter
        sk = "agent:main:mobile:dm:" + dev
        try:
            async with Phone(dev) as phone:
                loop = asyncio.get_running_loop()
                sent = []

                def notify(data):
                    fut = asyncio.run_coroutine_threadsafe(
                        a.send_exec_approval(dev, data["command"], sk, description=data["description"]), loop)
                    sent.append(fut.result(15))
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "rm -rf ~/tmp/cache", "description": "Frees 2 GB"}, notify, 20))
                card = await phone.expect(lambda f: f["t"] == "prompt")
                res = (await answered(sent, 1))[0]
                assert res.success
                assert (card["id"], card["kind"], card["command"], card["description"]) == (
                    res.message_id, "exec_approval", "rm -rf ~/tmp/cache", "Frees 2 GB")
                await phone.send(t="prompt", prompt_id=card["id"], option_id="session")
                await phone.expect(lambda f: f["t"] == "prompt_done")
                assert decided(await asyncio.wait_for(waiter, 10)) == (True, "session")

                res = await a.send_slash_confirm(dev, "Reload MCP?", "This clears the prompt cache.", sk, "sc-7")
                card = await phone.expect(lambda f: f["t"] == "prompt")
                assert card["kind"] == "slash_confirm" and "Reload MCP?" in card["text"]
                await phone.send(t="prompt", prompt_id=card["id"], option_id="always")
                assert (await answered(slash_confirm.calls, 1))[-1] == (sk, "sc-7", "always")
                f = await phone.expect(lambda f: f["t"] == "message")
                assert f["text"] == "confirmed: always"  # the handler's output goes back to the phone

                await a.send_clarify(dev, "Which city?", ["Berlin", "Paris"], "cl-1", sk)
                card = await phone.expect(lambda f: f["t"] == "prompt")
                assert [o["id"] for o in card["options"]] == ["c0", "c1", "other"]
                await phone.send(t="prompt", prompt_id=card["id"], option_id="c1")
                assert (await answered(clarify_gateway.calls, 1))[-1] == ("resolve", "cl-1", "Paris")

                await a.send_clarify(dev, "Which city?", ["Berlin"], "cl-2", sk)
                card = await phone.expect(lambda f: f["t"] == "prompt")
                await phone.send(t="prompt", prompt_id=card["id"], option_id="other", text="Rome")
                assert (await answered(clarify_gateway.calls, 2))[-1] == ("resolve", "cl-2", "Rome")

                # The answer is not a chat message.
                await hermes.no_event(dev, wait=0.5)
        finally:
            await hermes.stop()

    run(main())


def test_expired_cards_resolve_safely(tmp_path, monkeypatch):
    """Each card lives its wait less 2 s (6 s here): expired unanswered, an
    approval is nobody's deny (withdrawn where Hermes can withdraw it), a
    question takes the next message, a confirmation is cancelled."""
    set_hermes_waits(monkeypatch, approval=6, clarify=6, slash_confirm=6)

    async def main():
        from tools import approval, clarify_gateway, slash_confirm

        dev = device_id("exp")
        hermes = await Hermes(tmp_path).start()
        a = hermes.adapter
        sk = "agent:main:mobile:dm:" + dev
        n_appr, n_clar, n_conf = len(approval.calls), len(clarify_gateway.calls), len(slash_confirm.calls)
        try:
            async with Phone(dev) as phone:
                loop = asyncio.get_running_loop()

                def notify(data):
                    fut = asyncio.run_coroutine_threadsafe(a.send_exec_approval(dev, data["command"], sk), loop)
                    assert fut.result(15).success
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "reboot"}, notify, 6))
                await phone.expect(lambda f: f["t"] == "prompt")
                assert (await a.send_clarify(dev, "Name?", None, "cl-9", sk)).success
                assert (await a.send_slash_confirm(dev, "Reload?", "", sk, "sc-9")).success
                for _ in range(3):
                    await phone.expect(lambda f: f["t"] == "prompt_done" and f.get("expired"), timeout=15)
                got = await asyncio.wait_for(waiter, 35)
                # Nobody said deny. The newest Hermes reports a withdrawn approval as
                # resolved with no choice and the cause, and fails closed on it.
                if NEWEST:
                    assert decided(got) == (True, None) and got.get("cancelled"), got
                else:
                    assert decided(got) == (False, None), got
                await answered(clarify_gateway.calls, n_clar + 1, 15)
                await answered(slash_confirm.calls, n_conf + 1, 15)
                assert clarify_gateway.calls[n_clar] == ("awaiting_text", "cl-9")  # the next message answers
                assert slash_confirm.calls[n_conf] == (sk, "sc-9", "cancel")
        finally:
            await hermes.stop()

    run(main())
