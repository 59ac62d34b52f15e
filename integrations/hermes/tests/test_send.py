"""Out of process: hermes send --to mobile:<device> and cron deliver=mobile,
and the plugin's registration."""


from conftest import Phone, device_id, env, run


def config(**extra):
    from gateway.config import PlatformConfig

    base = {"router_url": env("MOBILE_TEST_ROUTER_URL"), "deliver_token": env("MOBILE_TEST_DELIVER_TOKEN")}
    base.update(extra)
    return PlatformConfig(extra=base)


def test_target_parsing():
    from adapter import parse_target_ref, validate_target_ref

    assert parse_target_ref("tel-1") == ("tel-1", None)
    assert parse_target_ref("mobile:tel-1") == ("tel-1", None)
    assert parse_target_ref(" MOBILE:tel-1 ") == ("tel-1", None)
    assert parse_target_ref("x" * 120) == ("x" * 120, None)
    for bad in ("", "mobile:", "x" * 121, "two words", "a/b", "tab\there"):
        assert parse_target_ref(bad) is None, bad
        assert validate_target_ref(bad) is not True
    assert validate_target_ref("tel-1") is True


def test_standalone_send(tmp_path, monkeypatch):
    async def main():
        from adapter import standalone_send

        dev = device_id("cron")
        async with Phone(dev) as phone:
            res = await standalone_send(config(), "mobile:" + dev, "Backup finished: 42 GB")
            assert res.get("success"), res
            f = await phone.expect(lambda f: f["t"] == "message")
            assert (f["id"], f["text"], f["final"]) == (res["message_id"], "Backup finished: 42 GB", True)

            report = tmp_path / "report.pdf"
            report.write_bytes(b"%PDF-1.4 42")
            photo = tmp_path / "photo.png"
            photo.write_bytes(b"\x89PNG\r\n\x1a\nxx")
            res = await standalone_send(config(), dev, "", media_files=[str(report), (str(photo), False)])
            assert res.get("success"), res
            f = await phone.expect(lambda f: f["t"] == "media")
            assert (f["kind"], f["filename"]) == ("document", "report.pdf")
            f = await phone.expect(lambda f: f["t"] == "media")
            assert (f["kind"], f["filename"]) == ("image", "photo.png")
            res = await standalone_send(config(), dev, "", media_files=[str(photo)], force_document=True)
            f = await phone.expect(lambda f: f["t"] == "media")
            assert f["kind"] == "document"

            # cron deliver=mobile: no chat id, the home device.
            monkeypatch.setenv("MOBILE_HOME_DEVICE", dev)
            res = await standalone_send(config(), "", "Good morning")
            assert res.get("success"), res
            f = await phone.expect(lambda f: f["t"] == "message")
            assert f["text"] == "Good morning"

        res = await standalone_send(config(), device_id("nobody"), "hello?")
        assert "device_offline" in res["error"]
        res = await standalone_send(config(deliver_token="wrong"), dev, "hello?")
        assert "auth_failed" in res["error"]
        monkeypatch.delenv("MOBILE_HOME_DEVICE")
        assert "MOBILE_HOME_CHANNEL" in (await standalone_send(config(), "", "x"))["error"]
        assert "MOBILE_DELIVER_TOKEN" in (await standalone_send(config(deliver_token=""), dev, "x"))["error"]

    run(main())


def test_register():
    import adapter

    got = {}

    class Ctx:
        def register_platform(self, **kwargs):
            got.update(kwargs)

    adapter.register(Ctx())
    assert got["name"] == "mobile"
    assert got["standalone_sender_fn"] is adapter.standalone_send
    assert got["cron_deliver_env_var"] == "MOBILE_HOME_CHANNEL"
    from conftest import HERMES_VERSION
    if HERMES_VERSION != "0.18":  # 0.18's PlatformEntry has no target hooks
        assert got["parse_target_ref_fn"]("mobile:tel-1") == ("tel-1", None)
    else:
        assert "parse_target_ref_fn" not in got
    assert isinstance(got["adapter_factory"](config()), adapter.MobileAdapter)
    assert adapter.MobileAdapter.SUPPORTS_MESSAGE_EDITING is True



def test_env_enablement(monkeypatch):
    from adapter import env_enablement

    assert env_enablement() is None
    monkeypatch.setenv("MOBILE_AGENT_TOKEN", "t")
    monkeypatch.setenv("MOBILE_HOME_DEVICE", "tel-1")
    seed = env_enablement()
    assert seed["home_channel"] == {"chat_id": "tel-1", "name": "Home"}
    assert seed["router_url"] == "http://127.0.0.1:8788"
