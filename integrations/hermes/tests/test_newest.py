"""What the newest Hermes line changed (issue 27 and after), and Hermes's own
meanings on every line: the plugin loads on the newest release and on source
builds, an expired card is no user's deny (the newest line reports it
withdrawn), cards close when the runner replaced the plugin's settle hook, a
timed-out card is retired, the localized default reason, clarify without a
limit, multi-select answers as Hermes canonicalises them, the approval Hermes
names in metadata, and one phone's slow or failing event."""

import asyncio
import json
import shutil

import pytest

from conftest import (HERMES_VERSION, HERE, NEWEST, WAIT, Hermes, Phone, decided, device_id, env, latest_cursor,
                      run, set_hermes_waits)

PLUGIN = HERE.parent
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


def card_request(approval, sk):
    """The request id of the session's one pending approval."""
    return approval.list_gateway_approvals(sk)[0]["request_id"]


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
    """The card expires before Hermes's wait (approvals.timeout 6 s, the card
    4 s): nobody refused. Where Hermes can, the approval is withdrawn at once,
    and the newest Hermes's wait then returns resolved with no choice and the
    cause (it reports "withdrawn before the user answered" and fails closed);
    elsewhere Hermes's own timeout ends it, unresolved."""
    set_hermes_waits(monkeypatch, approval=6)

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
                    notify_with(hermes, dev, sk, asyncio.get_running_loop()), 6))
                card = await phone.expect(is_card)
                assert card["timeout_seconds"] == 4, card
                await phone.expect(lambda f: f["t"] == "prompt_done" and f["id"] == card["id"], timeout=15)
                got = await asyncio.wait_for(waiter, 15)
                assert got["choice"] is None, got
                assert not any(c[1] == "deny" for c in approval.calls[n:] if c[0] == sk), approval.calls[n:]
                if NEWEST:
                    assert decided(got) == (True, None) and got.get("cancelled"), got
                    assert [c[0] for c in approval.calls[n:]] == ["withdraw"]
                else:
                    assert decided(got) == (False, None), got
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
                assert decided(await asyncio.wait_for(waiter, 10)) == (True, "once")
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.skipif(not NEWEST, reason="the localized default reason is the newest line's")
def test_localized_default_reason_still_gets_a_card(tmp_path):
    """The newest Hermes shows its localized default reason
    (ea_default_reason_text()), not "dangerous command", for an approval
    without a description; without an approval_id to bind by, the card is
    still bound to it (else Hermes falls back to a text prompt)."""
    async def main():
        from gateway.platforms.base_exec_approval import ea_default_reason_text
        from tools import approval
        reason = ea_default_reason_text()
        assert reason != "dangerous command"
        dev = device_id("l10n")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                sent = asyncio.Queue()
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "rm -r build", "description": ""},
                    notify_with(hermes, dev, sk, asyncio.get_running_loop(), description=reason, sent=sent), 20))
                card = await phone.expect(is_card)
                assert (await asyncio.wait_for(sent.get(), WAIT)).success
                assert card["description"] == reason
                await phone.send(t="prompt", prompt_id=card["id"], option_id="once")
                assert decided(await asyncio.wait_for(waiter, 10)) == (True, "once")
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.skipif(not NEWEST, reason="retire_exec_approval_card is the newest line's hook")
def test_timed_out_card_is_retired_not_edited(tmp_path):
    """The newest runner's timeout notice first calls the adapter's
    retire_exec_approval_card(chat_id, card id) when it has one: the card
    closes on the phone (a tap then resolves nothing) and the notice arrives
    as a message of its own; the card is not edited."""
    async def main():
        from gateway import run_turn_runner_approval_settle as settle
        from gateway.run_turn_runner import TurnRunner
        from gateway.run_turn_runner_approval_notify import notify_approval
        from tools import approval
        dev = device_id("retire")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        runner = TurnRunner(hermes.adapter, asyncio.get_running_loop(), dev, sk)
        try:
            async with Phone(dev) as phone:
                waiter = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, {"command": "reboot", "description": "d"},
                    lambda data: notify_approval(runner, data), 60))
                card = await phone.expect(is_card)
                for _ in range(200):  # the runner has the card's id: it registered its notice
                    if approval.settles.count(card_request(approval, sk)) >= 2:
                        break
                    await asyncio.sleep(0.05)
                # What that notice does when the wait times out.
                await settle._post_timeout_notice(runner._ctx, "reboot", card["id"], 300)
                got = {f["t"]: f for f in [await phone.expect(lambda f: f["t"] in ("message", "prompt_done"))
                                           for _ in range(2)]}
                done, notice = got["prompt_done"], got["message"]
                assert done["id"] == card["id"] and done.get("expired"), done
                assert notice["id"] != card["id"] and notice["text"].startswith("⌛ Approval timed out"), notice
                assert [n[0] for n in settle.notices if n[1] == dev] == ["retire", "send"]
                await phone.send(t="prompt", prompt_id=card["id"], option_id="once")  # too late
                await phone.expect(lambda f: f["t"] == "prompt_done" and f["id"] == card["id"])
                assert approval.waiting(sk) == 1
                approval.resolve_gateway_approval(sk, "deny")
                assert decided(await asyncio.wait_for(waiter, 10)) == (True, "deny")
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.skipif(not REQUEST_IDS, reason="v0.18 has no request ids")
def test_metadata_approval_id_binds_the_card(tmp_path):
    """Two look-alike approvals pending (the same command and description;
    different pattern keys, so the newest Hermes does not coalesce them);
    Hermes names the second in metadata (approval_id): the card answers that
    one, not the oldest look-alike."""
    async def main():
        from tools import approval
        dev = device_id("apprid")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        data = {"command": "git push --force", "description": "rewrites history"}
        try:
            async with Phone(dev) as phone:
                first = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, dict(data, pattern_keys=["force push"]), lambda d: None, 20))
                while approval.waiting(sk) < 1:
                    await asyncio.sleep(0.02)
                second = asyncio.create_task(asyncio.to_thread(
                    approval.request, sk, dict(data, pattern_keys=["history rewrite"]),
                    notify_with(hermes, dev, sk, asyncio.get_running_loop(),
                                metadata=lambda d: {"approval_id": d["request_id"]}), 20))
                card = await phone.expect(is_card)
                await phone.send(t="prompt", prompt_id=card["id"], option_id="deny")
                assert decided(await asyncio.wait_for(second, 10)) == (True, "deny")
                assert not first.done() and approval.waiting(sk) == 1
                approval.resolve_gateway_approval(sk, "deny")
                await first
        finally:
            await hermes.stop()
    run(main())


def test_clarify_without_limit_keeps_its_card(tmp_path, monkeypatch):
    """agent.clarify_timeout 0 (or less) means Hermes waits until answered: the
    card lives until answered or withdrawn, at most the router's
    MOBILE_PROMPT_MAX_TTL (2 h in this suite), not MOBILE_PROMPT_TTL (4 s
    here): still open after 5 s, it is answered then."""
    async def main():
        from tools import clarify_gateway
        set_hermes_waits(monkeypatch, clarify=0)
        dev = device_id("forever")
        hermes = await Hermes(tmp_path).start()
        n = len(clarify_gateway.calls)
        try:
            async with Phone(dev) as phone:
                assert (await hermes.adapter.send_clarify(dev, "Which city?", ["Berlin", "Paris"], "cl-f", "sk")).success
                card = await phone.expect(is_card)
                assert card["timeout_seconds"] == int(env("MOBILE_TEST_PROMPT_MAX_TTL")), card
                with pytest.raises(AssertionError):  # past MOBILE_PROMPT_TTL nothing closes it
                    await phone.expect(lambda f: f["t"] == "prompt_done", timeout=5)
                await phone.send(t="prompt", prompt_id=card["id"], option_id="c1")
                await phone.expect(lambda f: f["t"] == "prompt_done" and f["id"] == card["id"] and not f.get("expired"))
                for _ in range(100):
                    if len(clarify_gateway.calls) > n:
                        break
                    await asyncio.sleep(0.05)
                assert clarify_gateway.calls[n:] == [("resolve", "cl-f", "Paris")]
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.skipif(not NEWEST, reason="multi-select clarify is registered on the entry from v0.22 on")
@pytest.mark.parametrize("typed,agent_gets", [
    ("1, 3", ["Berlin", "Rome"]),
    ("berlin, rome", ["Berlin", "Rome"]),
    ("Rome berlin", None),  # no comma and not all numbers: one label, which names no city
    ("3 1 3", ["Rome", "Berlin"]),
    ("1, 7", None),  # out of range: the whole reply is taken as typed
])
def test_multi_select_typed_answer_as_hermes_canonicalises_it(tmp_path, typed, agent_gets):
    """A multi-select answer typed under "other" reaches the agent as Hermes's
    own parser makes it: the first choice reaches the adapter marked
    "(Recommended)" (mark_recommended); the typed numbers or names, in any
    case, with or without the mark, become the JSON list of labels Hermes's
    _coerce_multi_select_text gives, which the clarify tool cleans
    (_parse_multi_select_response, strip_recommended) into what the agent
    gets; a reply Hermes rejects goes as typed, as Hermes takes it after
    "other"."""
    async def main():
        from tools import clarify_gateway, clarify_tool
        dev = device_id("multi")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        n = len(clarify_gateway.calls)
        cities = clarify_tool.mark_recommended(["Berlin", "Paris", "Rome"])
        assert cities[0] == "Berlin (Recommended)"
        try:
            async with Phone(dev) as phone:
                entry = clarify_gateway.register("cl-m1", sk, "Which cities?", cities, multi_select=True)
                await hermes.adapter.send_clarify(dev, "Which cities?", cities, "cl-m1", sk)
                card = await phone.expect(is_card)
                await phone.send(t="prompt", prompt_id=card["id"], option_id="other", text=typed)
                for _ in range(200):
                    if len(clarify_gateway.calls) > n:
                        break
                    await asyncio.sleep(0.05)
                (what, cid, answer), = clarify_gateway.calls[n:]
                entry.awaiting_text = True  # "other" was chosen: what Hermes makes of the same text
                assert (what, cid, answer) == ("resolve", "cl-m1", clarify_gateway._coerce_text_response(entry, typed))
                got = clarify_tool._clean_answer(entry.response, multi=True)
                assert got == (agent_gets or clarify_tool._parse_multi_select_response(typed)), got
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.skipif(not NEWEST, reason="multi-select clarify is registered on the entry from v0.22 on")
def test_multi_select_button_answers_its_choice(tmp_path):
    """A button of a multi-select card is the list of that one choice."""
    async def main():
        from tools import clarify_gateway, clarify_tool
        dev = device_id("multib")
        sk = "agent:main:mobile:dm:" + dev
        hermes = await Hermes(tmp_path).start()
        n = len(clarify_gateway.calls)
        cities = clarify_tool.mark_recommended(["Berlin", "Paris", "Rome"])
        try:
            async with Phone(dev) as phone:
                entry = clarify_gateway.register("cl-m2", sk, "Which cities?", cities, multi_select=True)
                await hermes.adapter.send_clarify(dev, "Which cities?", cities, "cl-m2", sk)
                card = await phone.expect(is_card)
                await phone.send(t="prompt", prompt_id=card["id"], option_id="c0")
                for _ in range(200):
                    if len(clarify_gateway.calls) > n:
                        break
                    await asyncio.sleep(0.05)
                assert clarify_gateway.calls[n:] == [("resolve", "cl-m2", json.dumps(["Berlin (Recommended)"]))]
                assert clarify_tool._clean_answer(entry.response, multi=True) == ["Berlin"]
        finally:
            await hermes.stop()
    run(main())


@pytest.mark.parametrize("typed,want", [("2", "Paris"), ("paris", "Paris"), ("berlin", "Berlin (Recommended)"),
                                        ("Lisbon", "Lisbon")])
def test_single_choice_typed_answer_as_hermes_canonicalises_it(tmp_path, typed, want):
    """A single-choice answer typed under "other" is Hermes's choice when it
    names one (its number, or its label in any case, with or without the
    "(Recommended)" mark), else the text as typed."""
    async def main():
        from tools import clarify_gateway
        dev = device_id("single")
        hermes = await Hermes(tmp_path).start()
        n = len(clarify_gateway.calls)
        cities = ["Berlin (Recommended)", "Paris"]
        try:
            async with Phone(dev) as phone:
                await hermes.adapter.send_clarify(dev, "Which city?", cities, "cl-s1", "sk")
                card = await phone.expect(is_card)
                await phone.send(t="prompt", prompt_id=card["id"], option_id="other", text=typed)
                for _ in range(200):
                    if len(clarify_gateway.calls) > n:
                        break
                    await asyncio.sleep(0.05)
                assert clarify_gateway.calls[n:] == [("resolve", "cl-s1", want)]
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
