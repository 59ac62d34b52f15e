"""Stand-in for tools.approval_context of Hermes Agent's newest line, modelled on
NousResearch/hermes-agent tools/approval_context.py as stored at 079b5a95 (no release tag
could be tied to that version): `_get_approval_timeout()` reads approvals.timeout, 300 s
by default. Written for these tests, not copied: config.yaml is TIMEOUT here, and
`per_thread(timeout)` lets the test helper approval.request() give one wait its own
approvals.timeout (Hermes reads one value for every wait)."""

import contextlib
import threading

TIMEOUT = 300  # approvals.timeout
_local = threading.local()
hooks: list = []  # (hook name, payload) of _fire_approval_hook


def _get_approval_timeout() -> int:
    return int(getattr(_local, "timeout", TIMEOUT))


@contextlib.contextmanager
def per_thread(timeout):
    """approvals.timeout for the waits of this thread (None: TIMEOUT)."""
    if timeout is None:
        yield
        return
    _local.timeout = timeout
    try:
        yield
    finally:
        del _local.timeout


def _fire_approval_hook(hook_name: str, **kwargs) -> None:
    hooks.append((hook_name, kwargs))
