"""Stand-in for tools.slash_confirm: records resolve calls; the handler's
output is "confirmed: <choice>"."""

from typing import Optional

calls: list = []


async def resolve(session_key: str, confirm_id: str, choice: str, timeout: float = 300) -> Optional[str]:
    calls.append((session_key, confirm_id, choice))
    return f"confirmed: {choice}"
