"""The plugin inside Hermes as each supported version runs it (the stand-ins
of hermes_v0_18 / hermes_v0_21): loading, registration, approval cards bound
to their own wait, and the rows of the compatibility table."""

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import HERMES_VERSION, HERE, NEWEST, Hermes, Phone, decided, device_id, env, run, set_hermes_waits

PLUGIN = HERE.parent
V021 = HERMES_VERSION != "0.18"  # request ids, settle hooks, target refs (0.21 and later)


def is_card(f):
    return f["t"] == "prompt"


def test_readme_install_loads_and_a_phone_reaches_the_handler(tmp_path, hermes_home):
    """integrations/hermes/README.md, "Install", to the letter: `cp -r
    integrations/hermes ~/.hermes/plugins/mobile`, `hermes plugins enable
    mobile` (which writes plugins.enabled in config.yaml), and Hermes loads
    it as a directory plugin."""
    async def main():
        from gateway.config import PlatformConfig
        from gateway.platform_registry import platform_registry
        from hermes_cli.plugins import PluginManager

        shutil.copytree(PLUGIN, hermes_home / "plugins" / "mobile")
        (hermes_home / "config.yaml").write_text("plugins:\n  enabled: [mobile]\n")
        manager = PluginManager()
        manager.discover_and_load()
        assert manager.errors == {} and "mobile" in manager.loaded, manager.errors
        entry = platform_registry.get("mobile")
        assert entry is not None and entry.plugin_name == "mobile"

        cursor = tmp_path / "cursor"
        from conftest import latest_cursor
        cursor.write_text(await latest_cursor())
        cfg = PlatformConfig(extra={"router_url": env("MOBILE_TEST_ROUTER_URL"),
                                    "agent_token": env("MOBILE_TEST_AGENT_TOKEN"), "cursor_file": str(cursor)})
        assert platform_registry.connected("mobile", cfg)
        adapter = platform_registry.create_adapter("mobile", cfg)
        got = asyncio.Queue()

        async def handler(event):
            await got.put(event)
        adapter.set_message_handler(handler)
        assert await adapter.connect()
        dev = device_id("readme")
        try:
            async with Phone(dev) as phone:
                await phone.text("m-1", "hello from the phone")
                while True:
                    ev = await asyncio.wait_for(got.get(), 10)
                    if sys.modules[type(adapter).__module__]._device_of(ev.source.chat_id) == dev:
                        break
                assert ev.text == "hello from the phone"
        finally:
            await adapter.disconnect()
    run(main())


def test_registers_only_fields_this_hermes_knows():
    """Row 2: v0.18's PlatformEntry has no parse_target_ref_fn; register_platform takes **kwargs."""
    import adapter as plugin
    from gateway.platform_registry import platform_registry
    from hermes_cli.plugins import PluginContext, PluginManager

    platform_registry.unregister("mobile")
    plugin.register(PluginContext({"name": "mobile"}, PluginManager()))
    entry = platform_registry.get("mobile")
    assert entry is not None
    assert (getattr(entry, "parse_target_ref_fn", None) is not None) == V021


def test_enabled_only_with_a_token():
    """Row 9: Hermes enables a plugin platform by is_connected, else by check_fn alone."""
    import adapter as plugin
    from gateway.config import PlatformConfig
    from gateway.platform_registry import platform_registry
    from hermes_cli.plugins import PluginContext, PluginManager

    plugin.register(PluginContext({"name": "mobile"}, PluginManager()))
    assert not platform_registry.connected("mobile", PlatformConfig(extra={}))
    assert platform_registry.connected("mobile", PlatformConfig(extra={"agent_token": "t"}))


def test_manifest_declares_the_supported_range():
    """Row 11: nothing in the manifest shuts out a release or a source build
    (0.0.0); the env vars are declared."""
    from hermes_cli.plugins import version_satisfies

    manifest = yaml.safe_load((PLUGIN / "plugin.yaml").read_text())
    spec = str(manifest.get("requires_hermes") or "")
    for v in ("0.0.0", "0.18.2", "0.21.3", "0.22.0", "0.23.6", "0.24.0"):
        assert version_satisfies(spec, v), v
    assert "aiohttp" in manifest["python_dependencies"]
    optional = {e["name"] for e in manifest["optional_env"]}
    assert {"MOBILE_ALLOWED_USERS", "MOBILE_HOME_CHANNEL"} <= optional


def approve_in_thread(hermes, dev, sk, loop):
    """The runner's _approval_notify_sync: the card is sent from the agent thread through the loop."""
    def notify(data):
        fut = asyncio.run_coroutine_threadsafe(
            hermes.adapter.send_exec_approval(dev, data["command"], sk, data.get("description", "dangerous command")),
            loop)
        assert fut.result(15).success
    return notify


def test_stale_card_never_resolves_another_approval(tmp_path):
    """Row 4, across phone, edge, router and plugin: the first approval's wait
    ends, its card closes; a tap on it resolves nothing, the second approval
    stays pending and only its own card answers it."""
    async def main():
        from tools import approval
        dev = device_id("stale")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        loop = asyncio.get_running_loop()
        notify = approve_in_thread(hermes, dev, sk, loop)
        try:
            async with Phone(dev) as phone:
                first = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "ls ~/tmp", "description": "lists"}, notify, 1.0))
                card1 = await phone.expect(is_card)
                assert card1["command"] == "ls ~/tmp"
                assert (await first)["resolved"] is False  # Hermes stopped waiting
                await phone.expect(lambda f: f["t"] == "prompt_done" and f["id"] == card1["id"] and f.get("expired"))

                second = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "rm -rf ~/important", "description": "deletes"}, notify, 20))
                card2 = await phone.expect(is_card)
                assert card2["command"] == "rm -rf ~/important"
                await phone.send(t="prompt", prompt_id=card1["id"], option_id="once")
                await phone.expect(lambda f: f["t"] == "prompt_done" and f["id"] == card1["id"] and f.get("expired"))
                await asyncio.sleep(0.3)  # nothing may happen: the router and plugin had their chance
                assert approval.waiting(sk) == 1

                await phone.send(t="prompt", prompt_id=card2["id"], option_id="deny")
                assert decided(await asyncio.wait_for(second, 10)) == (True, "deny")
                if V021:
                    assert len(approval.settles) >= 2  # the cards closed on settle too
        finally:
            await hermes.stop()
    run(main())


def test_card_lives_no_longer_than_hermes_waits(tmp_path, monkeypatch):
    """Row 4: a card's timeout_seconds is under approvals.timeout."""
    async def main():
        from tools import approval
        set_hermes_waits(monkeypatch, approval=3)
        dev = device_id("ttl")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "reboot", "description": "d"},
                    approve_in_thread(hermes, dev, sk, asyncio.get_running_loop()), 3))
                card = await phone.expect(is_card)
                assert 1 <= card["timeout_seconds"] < 3
                await waiter
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.parametrize("how", ["approvals.timeout", "the wait's expires_at"])
def test_card_lives_as_long_as_hermes_waits(tmp_path, monkeypatch, how):
    """approvals.timeout 900: the card lives 898 s, as the router's card says,
    not the router's default MOBILE_PROMPT_TTL (4 s in this suite): the
    router keeps each card as long as its ttl asks (that it then expires at
    898 s and not before is pkg/router's TestPromptTTLExpiry, on a clock the
    test moves). The newest Hermes sends the wait's deadline (metadata
    expires_at, a time.monotonic() of its process), which the card follows."""
    if how != "approvals.timeout" and not NEWEST:
        pytest.skip("expires_at is sent from the newest line on")

    async def main():
        import adapter as plugin
        from tools import approval
        set_hermes_waits(monkeypatch, approval=900)
        dev = device_id("ttl900")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        loop = asyncio.get_running_loop()
        try:
            async with Phone(dev) as phone:
                if how == "approvals.timeout":
                    notify = approve_in_thread(hermes, dev, sk, loop)
                else:
                    from gateway.run_turn_runner import approval_notify
                    notify = approval_notify(hermes.adapter, loop, dev, sk)
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "make deploy", "description": "d"}, notify, 900))
                card = await phone.expect(is_card)
                assert card["timeout_seconds"] == 898, card
                if how != "approvals.timeout":  # what the plugin computed from the deadline
                    left = approval.list_gateway_approvals(sk)[0]["expires_at"] - time.monotonic()
                    assert plugin._card_ttl(left) in (897, 898)
                await phone.send(t="prompt", prompt_id=card["id"], option_id="deny")
                assert decided(await asyncio.wait_for(waiter, 10)) == (True, "deny")
        finally:
            await hermes.stop()
    run(main())


def test_buttons_offer_what_hermes_allows(tmp_path):
    """Rows 3 and 8: v0.21 draws cards only for adapters overriding its hook;
    smart_denied and allow_permanent narrow the buttons."""
    async def main():
        from tools import approval
        import adapter as plugin
        if V021:
            assert plugin.MobileAdapter.supports_exec_approval_buttons()
        dev = device_id("opts")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        loop = asyncio.get_running_loop()
        try:
            async with Phone(dev) as phone:
                def smart(data):
                    fut = asyncio.run_coroutine_threadsafe(hermes.adapter.send_exec_approval(
                        dev, data["command"], sk, data["description"], smart_denied=True), loop)
                    assert fut.result(15).success
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "curl x | sh", "description": "d"}, smart, 20))
                card = await phone.expect(is_card)
                assert [o["id"] for o in card["options"]] == ["once", "deny"]
                await phone.send(t="prompt", prompt_id=card["id"], option_id="always")  # not offered: deny
                assert (await asyncio.wait_for(waiter, 10))["choice"] == "deny"
                if V021:
                    from gateway.platforms.base import BasePlatformAdapter
                    def hook(data):
                        fut = asyncio.run_coroutine_threadsafe(BasePlatformAdapter.send_exec_approval(
                            hermes.adapter, dev, data["command"], sk, data["description"], allow_permanent=False), loop)
                        assert fut.result(15).success
                    waiter = asyncio.create_task(asyncio.to_thread(
                        approval.request, sk, {"command": "make", "description": "d"}, hook, 20))
                    card = await phone.expect(is_card)
                    assert [o["id"] for o in card["options"]] == ["once", "session", "deny"]
                    await phone.send(t="prompt", prompt_id=card["id"], option_id="session")
                    assert (await asyncio.wait_for(waiter, 10))["choice"] == "session"
        finally:
            await hermes.stop()
    run(main())


def test_retired_clarify_card_closes(tmp_path):
    """Row 10: v0.21 retires a clarify card whose wait ended unanswered."""
    async def main():
        dev = device_id("retire")
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                res = await hermes.adapter.send_clarify(dev, "Which city?", ["Berlin"], "cl-r", "sk")
                card = await phone.expect(is_card)
                await hermes.adapter.retire_clarify_card("cl-r", "")
                await phone.expect(lambda f: f["t"] == "prompt_done" and f["id"] == card["id"] and f.get("expired"))
                assert res.success
        finally:
            await hermes.stop()
    run(main())


def test_stream_ends_final(tmp_path):
    """Row 7: the first part of a stream is not final; the finalize edit is always sent."""
    async def main():
        import adapter as plugin
        assert plugin.MobileAdapter.REQUIRES_EDIT_FINALIZE is True
        dev = device_id("stream")
        hermes = await Hermes(tmp_path).start()
        a = hermes.adapter
        try:
            async with Phone(dev) as phone:
                res = await a.send(dev, "Hel", metadata={"expect_edits": True})
                f = await phone.expect(lambda f: f["t"] == "message")
                assert f.get("final") is not True
                await a.edit_message(dev, res.message_id, "Hello", finalize=True)
                f = await phone.expect(lambda f: f["t"] == "message")
                assert f["final"] is True and f["text"] == "Hello"
        finally:
            await hermes.stop()
    run(main())


def test_unreachable_router_is_retryable(tmp_path):
    """Row 6: _send_with_retry retries on SendResult.retryable or a network-looking error."""
    async def main():
        hermes = Hermes(tmp_path, router_url="http://127.0.0.1:9", token="t")
        hermes.cursor_file.write_text("0")
        await hermes.start(from_now=False)
        try:
            res = await hermes.adapter.send("tel-1", "hi")
            assert not res.success
            assert res.retryable or hermes.adapter._is_retryable_error(res.error), res  # Hermes's own test
        finally:
            await hermes.stop()
    run(main())


def test_home_channel_is_accepted(tmp_path, monkeypatch):
    """Row 12: MOBILE_HOME_CHANNEL (Hermes's own name) and MOBILE_HOME_DEVICE both name the home device."""
    async def main():
        import adapter as plugin
        from gateway.config import PlatformConfig
        dev = device_id("home")
        monkeypatch.setenv("MOBILE_HOME_CHANNEL", dev)
        monkeypatch.setenv("MOBILE_DELIVER_TOKEN", env("MOBILE_TEST_DELIVER_TOKEN"))
        async with Phone(dev) as phone:
            out = await plugin.standalone_send(PlatformConfig(extra={"router_url": env("MOBILE_TEST_ROUTER_URL")}),
                                               "", "to home")
            assert out.get("success"), out
            await phone.expect(lambda f: f["t"] == "message" and f["text"] == "to home")
    run(main())


def test_sender_is_the_authenticated_device(tmp_path):
    """Issue 9 row 6: hello.user.id is a claim; Hermes sees the device the gateway admitted."""
    async def main():
        dev = device_id("who")
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev, user_id="the-owner") as phone:
                await phone.text("m-1", "hi")
                ev = await hermes.next_event(dev)
                assert ev.source.user_id == dev
                assert ev.raw_message.get("auth") == "app"
        finally:
            await hermes.stop()
    run(main())


def test_send_to_a_device_by_name(tmp_path, monkeypatch):
    """Row 5: `hermes send --to mobile:<device>` reaches that device on each
    version: on v0.21 through parse_target_ref_fn, on v0.18 through the
    channel directory (a non-numeric id there would fall back to the home
    channel)."""
    async def main():
        import adapter as plugin
        from gateway.config import PlatformConfig
        dev, home = device_id("named"), device_id("home")
        monkeypatch.setenv("MOBILE_HOME_CHANNEL", home)
        monkeypatch.setenv("MOBILE_DELIVER_TOKEN", env("MOBILE_TEST_DELIVER_TOKEN"))
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                await phone.text("m-1", "hi")
                seen = await hermes.next_event(dev)  # Hermes now has a session with this chat
                if V021:
                    chat_id, _ = plugin.parse_target_ref("mobile:" + dev)
                else:
                    from tools.send_message_tool import target_chat_id
                    chat_id = target_chat_id("mobile:" + dev, home=home, session_chat_ids=[seen.source.chat_id])
                assert chat_id != home, chat_id
                cfg = PlatformConfig(extra={"router_url": env("MOBILE_TEST_ROUTER_URL")})
                out = await plugin.standalone_send(cfg, chat_id, "by name")
                assert out.get("success"), out
                await phone.expect(lambda f: f["t"] == "message" and f["text"] == "by name")
                res = await hermes.adapter.send(seen.source.chat_id, "a reply")  # and the live adapter
                assert res.success
                await phone.expect(lambda f: f["t"] == "message" and f["text"] == "a reply")
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.skipif(NEWEST, reason="the newest Hermes coalesces identical approvals: "
                                    "test_identical_approvals_share_one_card")
def test_parallel_identical_approvals_each_have_their_card(tmp_path):
    """Row 4: two pending approvals of the same command in one session (parallel
    subagents), on a Hermes that queues both: each card answers exactly one of them."""
    async def main():
        from tools import approval
        dev = device_id("twin")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        notify = approve_in_thread(hermes, dev, sk, asyncio.get_running_loop())
        data = {"command": "git push --force", "description": "rewrites history"}
        try:
            async with Phone(dev) as phone:
                waiters = [asyncio.create_task(asyncio.to_thread(approval.request, sk, data, notify, 20))
                           for _ in range(2)]
                cards = [await phone.expect(is_card), await phone.expect(is_card)]
                assert cards[0]["id"] != cards[1]["id"]
                await phone.send(t="prompt", prompt_id=cards[1]["id"], option_id="deny")
                done, pending = await asyncio.wait(waiters, timeout=10, return_when=asyncio.FIRST_COMPLETED)
                assert len(done) == 1 and decided(done.pop().result()) == (True, "deny")
                assert approval.waiting(sk) == 1
                await phone.send(t="prompt", prompt_id=cards[0]["id"], option_id="once")
                last = await asyncio.wait_for(pending.pop(), 10)
                assert decided(last) == (True, "once")
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.skipif(not NEWEST, reason="identical approvals are coalesced on the newest line")
@pytest.mark.parametrize("answer", ["session", "once"])
def test_identical_approvals_share_one_card(tmp_path, answer):
    """The newest Hermes coalesces identical concurrent approvals (same command
    and pattern keys) into one entry and one notify: one card. Its session /
    always / deny answers both; a once covers only the first, and the other
    then asks afresh, with a card of its own."""
    async def main():
        from tools import approval
        from gateway.run_turn_runner import approval_notify
        dev = device_id("twin")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        notify = approval_notify(hermes.adapter, asyncio.get_running_loop(), dev, sk)
        data = {"command": "git push --force", "description": "rewrites history", "pattern_keys": ["force push"]}
        try:
            async with Phone(dev) as phone:
                first = asyncio.create_task(asyncio.to_thread(approval.request, sk, data, notify, 20))
                card = await phone.expect(is_card)
                second = asyncio.create_task(asyncio.to_thread(approval.request, sk, data, notify, 20))
                await asyncio.sleep(0.3)  # the second joins the first: no entry, no card of its own
                assert approval.waiting(sk) == 1
                await phone.send(t="prompt", prompt_id=card["id"], option_id=answer)
                assert decided(await asyncio.wait_for(first, 10)) == (True, answer)
                if answer == "once":
                    again = await phone.expect(is_card)
                    assert again["id"] != card["id"] and again["command"] == data["command"]
                    await phone.send(t="prompt", prompt_id=again["id"], option_id="deny")
                    assert decided(await asyncio.wait_for(second, 10)) == (True, "deny")
                else:
                    got = await asyncio.wait_for(second, 10)
                    assert decided(got) == (True, answer) and got.get("coalesced"), got
                    with pytest.raises(AssertionError):
                        await phone.expect(is_card, timeout=0.5)
        finally:
            await hermes.stop()
    run(main())
