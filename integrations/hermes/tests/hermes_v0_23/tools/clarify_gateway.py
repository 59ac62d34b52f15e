"""Stand-in for tools.clarify_gateway of Hermes Agent's newest line, modelled on
NousResearch/hermes-agent tools/clarify_gateway.py at 0775bc80 (stored version; no release
tag could be tied to it). Written for these tests from that file's behaviour, not copied:

- register(clarify_id, session_key, question, choices, multi_select=False): the runner
  registers multi_select on the entry (it does not pass it to send_clarify); an entry
  without choices awaits text;
- resolve_gateway_clarify(clarify_id, response) unblocks the wait (False when the entry is
  gone or answered); mark_awaiting_text flips it to take the next typed message;
- how Hermes canonicalises a typed reply (_coerce_text_response_detailed): a multi-select
  reply of numbers and/or labels ("1,3", "1 3", "staging, prod") becomes a JSON array of
  the labels as shown (ensure_ascii=False), each once, in the order named; a label matches
  case-insensitively ignoring the "(Recommended)" mark (_label_matches); an out-of-range
  number or an unknown part rejects the whole reply (after "other", awaiting_text, the
  text is then taken as it is);
- get_clarify_timeout(): agent.clarify_timeout, 3600 by default; 0 or less is an
  unlimited wait.

calls (what resolve_gateway_clarify and mark_awaiting_text were given) is the tests' own."""

import json
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional

calls: list = []
TIMEOUT = 3600  # agent.clarify_timeout


@dataclass
class _ClarifyEntry:
    clarify_id: str
    session_key: str
    question: str
    choices: Optional[List[str]]
    multi_select: bool = False
    event: threading.Event = field(default_factory=threading.Event)
    response: Optional[str] = None
    awaiting_text: bool = False


_lock = threading.RLock()
_entries: Dict[str, _ClarifyEntry] = {}


def register(clarify_id: str, session_key: str, question: str, choices: Optional[List[str]],
             multi_select: bool = False) -> _ClarifyEntry:
    entry = _ClarifyEntry(clarify_id=clarify_id, session_key=session_key, question=question,
                          choices=list(choices) if choices else None,
                          multi_select=bool(multi_select) and bool(choices), awaiting_text=not bool(choices))
    with _lock:
        _entries[clarify_id] = entry
    return entry


def resolve_gateway_clarify(clarify_id: str, response: str) -> bool:
    calls.append(("resolve", clarify_id, response))
    with _lock:
        entry = _entries.get(clarify_id)
        if entry is None or entry.event.is_set():
            return False
        entry.response = str(response) if response is not None else ""
        entry.event.set()
        return True


def mark_awaiting_text(clarify_id: str) -> bool:
    calls.append(("awaiting_text", clarify_id))
    with _lock:
        entry = _entries.get(clarify_id)
        if entry is None:
            return False
        entry.awaiting_text = True
        return True


def _label_matches(text: str, choice) -> bool:
    from tools.clarify_tool import strip_recommended
    return strip_recommended(text).casefold() == strip_recommended(str(choice)).casefold()


def _coerce_multi_select_text(entry: _ClarifyEntry, text: str) -> Optional[str]:
    if not text:
        return None
    choices = entry.choices or []
    if "," in text:
        tokens = [t.strip() for t in text.split(",") if t.strip()]
    else:
        parts = text.split()
        tokens = [p.strip() for p in parts] if len(parts) > 1 and all(p.isdigit() for p in parts) else [text]
    selected: List[str] = []
    for token in tokens:
        if token.isdigit():
            idx = int(token) - 1
            if not 0 <= idx < len(choices):
                return None
            label = str(choices[idx]).strip()
        else:
            label = next((str(c).strip() for c in choices if _label_matches(token, c)), None)
            if label is None:
                return None
        if label not in selected:
            selected.append(label)
    return json.dumps(selected, ensure_ascii=False) if selected else None


def _coerce_text_response(entry: _ClarifyEntry, response: str) -> Optional[str]:
    """A typed reply as Hermes takes it; None when rejected."""
    text = str(response).strip()
    if not entry.choices:
        return text
    if entry.multi_select:
        coerced = _coerce_multi_select_text(entry, text)
        return coerced if coerced is not None else (text if entry.awaiting_text else None)
    try:
        idx = int(text) - 1
    except ValueError:
        idx = -1
    if 0 <= idx < len(entry.choices):
        return entry.choices[idx]
    for choice in entry.choices:
        if _label_matches(text, choice):
            return str(choice).strip()
    return text if entry.awaiting_text else None


def get_clarify_timeout() -> int:
    return int(TIMEOUT)
