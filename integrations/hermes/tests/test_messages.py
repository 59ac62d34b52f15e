"""Text both ways: a phone's message reaches Hermes, the answer streams back."""

from conftest import Hermes, Phone, device_id, run


def test_text_reaches_hermes_and_answer_streams(tmp_path):
    async def main():
        dev = device_id("msg")
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                await phone.text("m-1", "What's the weather?")
                ev = await hermes.next_event(dev)
                assert ev.text == "What's the weather?"
                assert ev.message_id == "m-1"
                assert ev.message_type.value == "text"
                from adapter import _device_of
                assert _device_of(ev.source.chat_id) == dev and ev.source.chat_type == "dm"
                assert ev.source.user_id == dev and ev.source.user_name == "Ann"  # the authenticated device; the name is display only

                await phone.text("m-2", "/status")
                assert (await hermes.next_event(dev)).message_type.value == "command"

                a = hermes.adapter
                await a.send_typing(dev)
                await phone.expect(lambda f: f["t"] == "typing" and not f.get("stop"))
                first = await a.send(dev, "Sunny")
                assert first.success and first.message_id
                f = await phone.expect(lambda f: f["t"] == "message")
                assert (f["id"], f["text"], f["final"]) == (first.message_id, "Sunny", True)
                assert (await a.edit_message(dev, first.message_id, "Sunny, 21 °C")).success
                f = await phone.expect(lambda f: f["t"] == "message")
                assert (f["text"], f.get("edit"), f["final"]) == ("Sunny, 21 °C", True, False)
                assert (await a.edit_message(dev, first.message_id, "Sunny, 21 °C, light wind.", finalize=True)).success
                f = await phone.expect(lambda f: f["t"] == "message")
                assert (f["id"], f["text"], f.get("edit"), f["final"]) == (first.message_id, "Sunny, 21 °C, light wind.", True, True)
                await a.stop_typing(dev)
                await phone.expect(lambda f: f["t"] == "typing" and f.get("stop"))

                # The phone's resend of an id is not a new event.
                await phone.text("m-1", "What's the weather?")
                await hermes.no_event(dev)
        finally:
            await hermes.stop()

    run(main())


def test_message_limit_at_the_boundary(tmp_path):
    async def main():
        dev = device_id("long")
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                text = "x" * 100_000  # the router's limit for an agent message
                res = await hermes.adapter.send(dev, text + "y")  # one more is cut, not refused
                assert res.success
                got = ""
                while True:
                    f = await phone.expect(lambda f: f["t"] == "message")
                    got += f["text"]
                    if f["final"]:
                        break
                assert got == text
        finally:
            await hermes.stop()

    run(main())


def test_wrong_agent_token_is_fatal(tmp_path):
    async def main():
        from gateway.platforms import base

        hermes = Hermes(tmp_path, token="not-a-token")
        assert await hermes.adapter.connect()
        for _ in range(100):
            if ("fatal", "auth_failed", False) in base.calls:
                break
            import asyncio
            await asyncio.sleep(0.05)
        assert ("fatal", "auth_failed", False) in base.calls
        assert ("notify_fatal",) in base.calls
        assert not hermes.adapter.is_connected
        await hermes.stop()

    run(main())
