"""Stand-in for gateway.platforms.base: the adapter base class, the event and
result types and the media cache helpers, with Hermes's signatures (v0.21.3's, with the
newest line's default description of send_exec_approval and pause_typing_for_chat)."""

import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, List, Optional

from gateway.session import SessionSource

calls: list = []  # ("cache_image", path), ("fatal", code), …


class MessageType(Enum):
    TEXT = "text"
    PHOTO = "photo"
    VIDEO = "video"
    AUDIO = "audio"
    VOICE = "voice"
    DOCUMENT = "document"
    COMMAND = "command"


@dataclass
class MessageEvent:
    text: str
    message_type: MessageType = MessageType.TEXT
    source: SessionSource = None
    raw_message: Any = None
    message_id: Optional[str] = None
    media_urls: List[str] = field(default_factory=list)
    media_types: List[str] = field(default_factory=list)
    timestamp: datetime = field(default_factory=datetime.now)


@dataclass
class SendResult:
    success: bool
    message_id: Optional[str] = None
    error: Optional[str] = None
    raw_response: Any = None
    retryable: bool = False


def _cache_dir(name: str) -> Path:
    d = Path(os.environ["HERMES_HOME"]) / "cache" / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def _write(kind: str, name: str, data: bytes) -> str:
    path = _cache_dir(kind) / name
    path.write_bytes(data)
    calls.append(("cache_" + kind, str(path)))
    return str(path)


def cache_image_from_bytes(data: bytes, ext: str = ".jpg") -> str:
    if not (data[:3] == b"\xff\xd8\xff" or data[:8] == b"\x89PNG\r\n\x1a\n"):
        raise ValueError("Refusing to cache non-image data")
    return _write("image", f"img_{uuid.uuid4().hex[:12]}{ext}", data)


def cache_audio_from_bytes(data: bytes, ext: str = ".ogg") -> str:
    return _write("audio", f"audio_{uuid.uuid4().hex[:12]}{ext}", data)


def cache_video_from_bytes(data: bytes, ext: str = ".mp4") -> str:
    return _write("video", f"video_{uuid.uuid4().hex[:12]}{ext}", data)


def cache_document_from_bytes(data: bytes, filename: str) -> str:
    return _write("document", f"doc_{uuid.uuid4().hex[:12]}_{Path(filename).name}", data)


class BasePlatformAdapter:
    """What the plugin uses of Hermes's base class. handle_message passes the
    event to the handler the test set (Hermes would run the agent)."""

    def __init__(self, config, platform):
        self.config = config
        self.platform = platform
        self._message_handler = None
        self._running = False
        self._fatal_error_code = None
        self._fatal_error_message = None

    @property
    def is_connected(self) -> bool:
        return self._running

    def set_message_handler(self, handler) -> None:
        self._message_handler = handler

    def _mark_connected(self) -> None:
        self._running = True

    def _mark_disconnected(self) -> None:
        self._running = False

    def _set_fatal_error(self, code: str, message: str, *, retryable: bool) -> None:
        self._running = False
        self._fatal_error_code, self._fatal_error_message = code, message
        calls.append(("fatal", code, retryable))

    async def _notify_fatal_error(self) -> None:
        calls.append(("notify_fatal",))

    def build_source(self, chat_id, chat_name=None, chat_type="dm", user_id=None, user_name=None, **kwargs):
        return SessionSource(platform=self.platform, chat_id=str(chat_id), chat_name=chat_name,
                             chat_type=chat_type, user_id=user_id, user_name=user_name)

    async def handle_message(self, event: MessageEvent) -> None:
        if self._message_handler:
            await self._message_handler(event)

    def pause_typing_for_chat(self, chat_id) -> None:
        calls.append(("pause_typing", chat_id))

    # Copied from Hermes: the stream consumer skips an unchanged finalize
    # edit unless an adapter sets this; _send_with_retry retries a failed
    # send when SendResult.retryable is set or the error text looks like one
    # of these network errors.
    REQUIRES_EDIT_FINALIZE: bool = False

    @staticmethod
    def _is_retryable_error(error) -> bool:
        return bool(error) and any(pat in error.lower() for pat in _RETRYABLE_ERROR_PATTERNS)


_RETRYABLE_ERROR_PATTERNS = ("connecterror", "connectionerror", "connectionreset", "connectionrefused",
                             "connecttimeout", "network", "broken pipe", "remotedisconnected", "eoferror")


@dataclass
class ExecApprovalPrompt:
    chat_id: str
    session_key: str
    metadata: Any
    command: str
    description: str
    smart_denied: bool
    text: str
    actions: list


def _exec_approval_actions(*, allow_permanent: bool, allow_session: bool, smart_denied: bool) -> list:
    labels = {"once": "Allow Once", "session": "Allow Session", "always": "Always Allow", "deny": "Deny"}
    choices = ["once"]
    if not smart_denied and allow_session:
        choices.append("session")
        if allow_permanent:
            choices.append("always")
    choices.append("deny")
    return [(labels[c], c, {"once": "primary", "deny": "danger"}.get(c, "")) for c in choices]


async def _base_send_exec_approval(self, chat_id, command, session_key, description=None,
                                   metadata=None, allow_permanent=True, allow_session=True, smart_denied=False):
    """BasePlatformAdapter.send_exec_approval: a template over _send_exec_approval_prompt (v0.21.3);
    the newest line's description defaults to ea_default_reason_text()."""
    if description is None:
        from gateway.platforms.base_exec_approval import ea_default_reason_text
        description = ea_default_reason_text()
    prompt = ExecApprovalPrompt(chat_id=chat_id, session_key=session_key, metadata=metadata,
                                command=str(command or ""), description=description, smart_denied=smart_denied,
                                text=f"Command Approval Required\n{command}\nReason: {description}",
                                actions=_exec_approval_actions(allow_permanent=allow_permanent,
                                                               allow_session=allow_session, smart_denied=smart_denied))
    return await self._send_exec_approval_prompt(prompt)


async def _base_send_exec_approval_prompt(self, prompt):
    return SendResult(success=False, error="Not supported")


def _supports_exec_approval_buttons(cls) -> bool:
    """The runner renders buttons only for adapters overriding _send_exec_approval_prompt."""
    return cls._send_exec_approval_prompt is not BasePlatformAdapter._send_exec_approval_prompt


BasePlatformAdapter.send_exec_approval = _base_send_exec_approval
BasePlatformAdapter._send_exec_approval_prompt = _base_send_exec_approval_prompt
BasePlatformAdapter.supports_exec_approval_buttons = classmethod(_supports_exec_approval_buttons)
