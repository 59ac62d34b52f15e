"""Stand-in for tools.approval_context of Hermes Agent v0.21.3 (00067189): approvals.timeout."""

TIMEOUT = 60


def _get_approval_timeout() -> int:
    return int(TIMEOUT)
