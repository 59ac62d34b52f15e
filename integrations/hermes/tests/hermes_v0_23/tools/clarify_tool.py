"""Stand-in for what tools.clarify_tool of Hermes Agent's newest line makes of a clarify
answer before the agent sees it, modelled on NousResearch/hermes-agent
tools/clarify_tool.py as stored at 0202bf0e (no release tag could be tied to it; later
versions name the same step _clean_answer). Written for these tests, not copied: the
first of several choices reaches the adapter marked "(Recommended)" (mark_recommended),
and the answer is cleaned of it: a multi-select answer is parsed as a list (a list, a JSON
array, else comma-separated: _parse_multi_select_response) and each part stripped of the
mark; a single answer is stripped of it."""

import json
from typing import List

RECOMMENDED_LABEL = "(Recommended)"


def strip_recommended(text: str) -> str:
    stripped = str(text).strip()
    if stripped.casefold().endswith(RECOMMENDED_LABEL.casefold()):
        return stripped[: -len(RECOMMENDED_LABEL)].strip()
    return stripped


def mark_recommended(choices: List[str]) -> List[str]:
    if len(choices) < 2:
        return choices
    first = str(choices[0]).strip()
    if first != strip_recommended(first):
        return choices
    return [f"{first} {RECOMMENDED_LABEL}"] + list(choices[1:])


def _parse_multi_select_response(raw) -> List[str]:
    if isinstance(raw, list):
        return [str(r).strip() for r in raw if str(r).strip()]
    raw = str(raw).strip()
    if raw.startswith("["):
        try:
            parsed = json.loads(raw)
            if isinstance(parsed, list):
                return [str(p).strip() for p in parsed if str(p).strip()]
        except json.JSONDecodeError:
            pass
    return [s.strip() for s in raw.split(",") if s.strip()]


def _clean_answer(raw, multi: bool):
    """The user_response the agent gets."""
    if multi:
        return [strip_recommended(r) for r in _parse_multi_select_response(raw)]
    return strip_recommended(raw)
