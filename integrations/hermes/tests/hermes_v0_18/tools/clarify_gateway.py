"""Stand-in for tools.clarify_gateway: records resolutions and text-capture requests."""

calls: list = []


def resolve_gateway_clarify(clarify_id: str, response: str) -> bool:
    calls.append(("resolve", clarify_id, response))
    return True


def mark_awaiting_text(clarify_id: str) -> bool:
    calls.append(("awaiting_text", clarify_id))
    return True


def get_clarify_timeout() -> int:
    """agent.clarify_timeout (3600 s by default)."""
    return 3600
