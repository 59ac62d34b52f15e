"""Stand-in for tools.approval: records resolve_gateway_approval calls."""

calls: list = []


def resolve_gateway_approval(session_key: str, choice: str, resolve_all: bool = False) -> int:
    calls.append((session_key, choice))
    return 1
