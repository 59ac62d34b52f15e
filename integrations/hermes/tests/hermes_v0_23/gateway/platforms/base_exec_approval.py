"""Stand-in for gateway.platforms.base_exec_approval of Hermes Agent's newest line,
modelled on NousResearch/hermes-agent gateway/platforms/base_exec_approval.py as the
index stores it with the localized accessors (ea_default_reason_text() and the others
read t("gateway.exec_approval.*") of the active display.language; the stored version's
commit is not named by the index, and no release tag could be tied to it). Written for
these tests, not copied. The English catalog entry of default_reason was not among the
files read, so DEFAULT_REASON stands for whatever the active language says: a text other
than "dangerous command", which is what the plugin must not depend on."""

DEFAULT_REASON = "Vom Sicherheitsfilter markiert"  # gateway.exec_approval.default_reason, some language
APPROVAL_TIMED_OUT_NOTICE = ("⌛ Approval timed out after {window} — the command was NOT run. "
                             "Ask me to try again if you still want it, or raise approvals.timeout in config.yaml.")


def ea_default_reason_text() -> str:
    return DEFAULT_REASON


def approval_timeout_seconds() -> int:
    from tools.approval_context import _get_approval_timeout
    return _get_approval_timeout()


def format_approval_window(seconds: int) -> str:
    """300 → "5 minutes" (the wording of tools.approval_context.format_approval_window,
    approximated)."""
    if seconds % 60 == 0 and seconds >= 60:
        n = seconds // 60
        return f"{n} minute{'s' if n != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def format_approval_timed_out_notice(timeout_s: int) -> str:
    return APPROVAL_TIMED_OUT_NOTICE.format(window=format_approval_window(timeout_s))
