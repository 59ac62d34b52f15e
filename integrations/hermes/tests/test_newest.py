"""What the newest Hermes line changed (issue 27), and Hermes's own meanings
on every line: the plugin loads on the newest release and on source builds,
an expired card is no user's deny, cards close when the runner replaced the
plugin's settle hook, clarify without a limit, multi-select answers, the
approval Hermes names in metadata, and one phone's slow or failing event."""

import asyncio
import json
import shutil

import pytest

from conftest import HERMES_VERSION, HERE, WAIT, Hermes, Phone, device_id, env, latest_cursor, run

PLUGIN = HERE.parent
NEWEST = HERMES_VERSION == "0.23"
REQUEST_IDS = HERMES_VERSION != "0.18"


def is_card(f):
    return f["t"] == "prompt"


@pytest.mark.parametrize("version", ["released", "0.0.0"])
def test_loads_on_this_hermes_and_on_a_source_build(hermes_home, monkeypatch, version):
    """Hermes ≥ 0.21 skips a plugin whose requires_hermes rejects its version:
    the newest release (0.23.6) and a source checkout (0.0.0) must load it."""
    from hermes_cli import plugins
    from gateway.platform_registry import platform_registry
    if version != "released":
        monkeypatch.setattr(plugins, "VERSION", version)
    platform_registry.unregister("mobile")
    shutil.copytree(PLUGIN, hermes_home / "plugins" / "mobile")
    (hermes_home / "config.yaml").write_text("plugins:\n  enabled: [mobile]\n")
    manager = plugins.PluginManager()
    manager.discover_and_load()
    assert manager.errors == {} and "mobile" in manager.loaded, (plugins.VERSION, manager.errors)
    assert platform_registry.get("mobile") is not None


def notify_with(hermes, dev, sk, loop, description=None, metadata=None, sent=None):
    """The runner's notify: the card is sent from the agent thread through the loop
    (its results go to sent)."""
    def notify(data):
        desc = data.get("description", "dangerous command") if description is None else description
        fut = asyncio.run_coroutine_threadsafe(hermes.adapter.send_exec_approval(
            dev, data["command"], sk, desc, metadata(data) if metadata else None), loop)
        res = fut.result(15)
        if sent is not None:
            loop.call_soon_threadsafe(sent.put_nowait, res)
        if not res.success:
            raise RuntimeError(res.error)
    return notify


def test_expired_card_is_not_the_users_deny(tmp_path, monkeypatch):
    """The card expires before Hermes's wait: nobody refused. Where Hermes can,
    the approval is withdrawn at once; elsewhere Hermes's own timeout ends it."""
    async def main():
        from tools import approval
        dev = device_id("expire")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        n = len(approval.calls)
        try:
            async with Phone(dev) as phone:
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "reboot", "description": "d"},
                    notify_with(hermes, dev, sk, asyncio.get_running_loop()), 8))
                card = await phone.expect(is_card)
                await phone.expect(lambda f: f["t"] == "prompt_done" and f["id"] == card["id"], timeout=15)
                got = await asyncio.wait_for(waiter, 15)
                assert got["choice"] != "deny" and got["resolved"] is False, got
                assert not any(c[1] == "deny" for c in approval.calls[n:] if c[0] == sk), approval.calls[n:]
                if NEWEST:
                    assert got.get("cancelled"), got
                    assert [c[0] for c in approval.calls[n:]] == ["withdraw"]
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.skipif(not NEWEST, reason="the turn runner replaces the settle hook from v0.22 on")
def test_card_closes_at_once_when_the_runner_replaced_the_hook(tmp_path, monkeypatch):
    """The runner registers its timeout notice after the card is sent, replacing
    the plugin's settle hook; the card must still close the moment the wait
    ends (here: /approve typed in chat), not at the next check (made 60 s)."""
    async def main():
        import adapter as plugin
        from gateway.run_turn_runner import approval_notify
        from tools import approval
        monkeypatch.setattr(plugin, "APPROVAL_POLL", 60)
        dev = device_id("hook")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "make deploy", "description": "d"},
                    approval_notify(hermes.adapter, asyncio.get_running_loop(), dev, sk), 30))
                card = await phone.expect(is_card)
                for _ in range(200):  # the runner registers its hook after the card is sent
                    if approval.settles.count(approval.list_gateway_approvals(sk)[0]["request_id"]) >= 2:
                        break
                    await asyncio.sleep(0.05)
                assert approval.resolve_gateway_approval(sk, "once") == 1  # /approve
                assert (await asyncio.wait_for(waiter, 10))["choice"] == "once"
                # The wait's settle ran before the waiter returned: the close is
                # already under way, long before the next check and before the
                # router's own expiry of the card (MOBILE_PROMPT_TTL, 4 s).
                for _ in range(20):
                    if card["id"] not in hermes.adapter._cards:
                        break
                    await asyncio.sleep(0.05)
                assert card["id"] not in hermes.adapter._cards, "the card waits for the next check"
                await phone.expect(lambda f: f["t"] == "prompt_done" and f["id"] == card["id"], timeout=WAIT)
        finally:
            await hermes.stop()
    run(main())


def test_timeout_notice_closes_the_card(tmp_path):
    """When Hermes's own timeout fires first, its notice edits the card: the
    card closes and the notice arrives as a message, not as a message whose
    id is the card's."""
    async def main():
        from tools import approval
        dev = device_id("notice")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                sent = asyncio.Queue()
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "reboot", "description": "d"},
                    notify_with(hermes, dev, sk, asyncio.get_running_loop(), sent=sent), 20))
                card = await phone.expect(is_card)
                assert (await asyncio.wait_for(sent.get(), WAIT)).message_id == card["id"]  # the runner has the id
                res = await hermes.adapter.edit_message(dev, card["id"], "⏱ Approval timed out.\n```\nreboot\n```")
                assert res.success
                f = await phone.expect(lambda f: f["t"] in ("message", "prompt_done"))
                assert f["id"] == card["id"] and f["t"] == "prompt_done", f
                f = await phone.expect(lambda f: f["t"] == "message")
                assert f["id"] != card["id"] and f["text"].startswith("⏱ Approval timed out."), f
                approval.resolve_gateway_approval(sk, "deny")
                await waiter
        finally:
            await hermes.stop()
    run(main())


def test_empty_description_still_gets_a_card(tmp_path):
    """Hermes shows "dangerous command" for an approval without a description;
    the card is still bound to it (else Hermes falls back to a text prompt)."""
    async def main():
        from tools import approval
        dev = device_id("nodesc")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "rm -r build", "description": ""},
                    notify_with(hermes, dev, sk, asyncio.get_running_loop(), description="dangerous command"), 20))
                card = await phone.expect(is_card)
                assert card["description"] == "dangerous command"
                await phone.send(t="prompt", prompt_id=card["id"], option_id="once")
                assert (await asyncio.wait_for(waiter, 10)) == {"resolved": True, "choice": "once"}
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.skipif(not REQUEST_IDS, reason="v0.18 has no request ids")
def test_metadata_approval_id_binds_the_card(tmp_path):
    """Two identical approvals pending; Hermes names the second in metadata
    (approval_id): the card answers that one, not the oldest look-alike."""
    async def main():
        from tools import approval
        dev = device_id("apprid")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        data = {"command": "git push --force", "description": "rewrites history"}
        try:
            async with Phone(dev) as phone:
                first = asyncio.create_task(asyncio.to_thread(approval.request, sk, data, lambda d: None, 20))
                while approval.waiting(sk) < 1:
                    await asyncio.sleep(0.02)
                second = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, data, notify_with(hermes, dev, sk, asyncio.get_running_loop(),
                                                            metadata=lambda d: {"approval_id": d["request_id"]}), 20))
                card = await phone.expect(is_card)
                await phone.send(t="prompt", prompt_id=card["id"], option_id="deny")
                assert await asyncio.wait_for(second, 10) == {"resolved": True, "choice": "deny"}
                assert not first.done() and approval.waiting(sk) == 1
                approval.resolve_gateway_approval(sk, "deny")
                await first
        finally:
            await hermes.stop()
    run(main())


def test_clarify_without_limit_keeps_its_card(tmp_path, monkeypatch):
    """agent.clarify_timeout 0 (or less) means Hermes waits forever: the card
    lives as long as the router allows (MOBILE_PROMPT_TTL, 4 s in this suite),
    not 1 second."""
    async def main():
        from tools import clarify_gateway
        monkeypatch.setattr(clarify_gateway, "get_clarify_timeout", lambda: 0)
        dev = device_id("forever")
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                assert (await hermes.adapter.send_clarify(dev, "Which city?", ["Berlin"], "cl-f", "sk")).success
                card = await phone.expect(is_card)
                assert card["timeout_seconds"] == 4, card
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.skipif(not NEWEST, reason="multi-select clarify is registered on the entry from v0.22 on")
def test_multi_select_clarify_answers_every_choice(tmp_path):
    """A multi-select question is answered with a JSON list of every choice the
    person named (numbers or names under "other"), or the one button tapped."""
    async def main():
        from tools import clarify_gateway
        dev = device_id("multi")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        n = len(clarify_gateway.calls)
        try:
            async with Phone(dev) as phone:
                cities = ["Berlin", "Paris", "Rome"]
                clarify_gateway.register("cl-m1", sk, "Which cities?", cities, multi_select=True)
                await hermes.adapter.send_clarify(dev, "Which cities?", cities, "cl-m1", sk)
                card = await phone.expect(is_card)
                await phone.send(t="prompt", prompt_id=card["id"], option_id="other", text="1, 3")
                clarify_gateway.register("cl-m2", sk, "Which cities?", cities, multi_select=True)
                await hermes.adapter.send_clarify(dev, "Which cities?", cities, "cl-m2", sk)
                card = await phone.expect(is_card)
                await phone.send(t="prompt", prompt_id=card["id"], option_id="c1")
                for _ in range(200):
                    if len(clarify_gateway.calls) >= n + 2:
                        break
                    await asyncio.sleep(0.05)
                got = clarify_gateway.calls[n:]
                assert got == [("resolve", "cl-m1", json.dumps(["Berlin", "Rome"])),
                               ("resolve", "cl-m2", json.dumps(["Paris"]))], got
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.parametrize("how", ["slow", "failing"])
def test_one_phones_event_does_not_hold_up_another(tmp_path, how):
    """A handler that hangs on (or fails with) one phone's message: the other
    phone's message still reaches Hermes."""
    async def main():
        slow, other = device_id("slow"), device_id("other")
        hermes = await Hermes(tmp_path).start()
        release, entered, got = asyncio.Event(), asyncio.Event(), asyncio.Queue()

        async def handler(event):
            from adapter import _device_of
            if _device_of(event.source.chat_id) == slow:
                entered.set()
                if how == "failing":
                    raise RuntimeError("the handler failed")
                await release.wait()
            await got.put(event)
        hermes.adapter.set_message_handler(handler)
        try:
            async with Phone(slow) as a, Phone(other) as b:
                await a.text("m-1", "first")
                await asyncio.wait_for(entered.wait(), WAIT)
                await b.text("m-2", "second")
                ev = await asyncio.wait_for(got.get(), WAIT)
                assert ev.text == "second"
                release.set()
        finally:
            await hermes.stop()
    run(main())
