"""Stand-in for how tools.send_message_tool of Hermes Agent v0.18.2
(7a43ab04) turns `--to mobile:<ref>` into a chat_id: _parse_target_ref takes
a numeric ref as explicit; another goes through
gateway.channel_directory.resolve_channel_name (exact id, then name, of the
directory built from the gateway's sessions plus channel_aliases.json), and
the resolved id is parsed again — a non-numeric one gives no chat_id, and
the message then goes to the home channel."""

import json
import os
from pathlib import Path


def _parse_target_ref(platform_name: str, target_ref: str):
    if target_ref.lstrip("-").isdigit():
        return target_ref, None, True
    return None, None, False


def _directory(platform_name: str, session_chat_ids) -> list:
    """_build_from_sessions (the chat ids of the gateway's sessions) overlaid with channel_aliases.json."""
    entries = [{"id": c, "name": c, "type": "dm"} for c in session_chat_ids]
    aliases_file = Path(os.environ["HERMES_HOME"]) / "channel_aliases.json"
    try:
        aliases = json.loads(aliases_file.read_text()).get(platform_name) or {}
    except (OSError, ValueError):
        aliases = {}
    for chat_id, friendly in aliases.items():
        matched = False
        for e in entries:
            if e["id"] == chat_id:
                e["name"] = friendly
                matched = True
        if not matched:
            entries.append({"id": chat_id, "name": friendly, "type": "dm"})
    return entries


def resolve_channel_name(platform_name: str, name: str, session_chat_ids=()):
    channels = _directory(platform_name, session_chat_ids)
    raw = name.strip()
    for ch in channels:
        if ch["id"] == raw:
            return ch["id"]
    query = name.lstrip("#").strip().lower()
    for ch in channels:
        if ch["name"].lstrip("#").strip().lower() == query:
            return ch["id"]
        if f"{ch['name']} ({ch['type']})".lower() == query:
            return ch["id"]
    return None


def target_chat_id(target: str, home: str = "", session_chat_ids=()):
    """The chat_id send_message delivers `target` to, or an error dict."""
    platform_name, _, target_ref = target.partition(":")
    chat_id = None
    if target_ref:
        chat_id, _thread, explicit = _parse_target_ref(platform_name, target_ref)
        if not explicit:
            resolved = resolve_channel_name(platform_name, target_ref, session_chat_ids)
            if not resolved:
                return {"error": f"Could not resolve '{target_ref}' on {platform_name}."}
            chat_id, _thread, _ = _parse_target_ref(platform_name, resolved)
    return chat_id or home or {"error": "No home channel set"}
