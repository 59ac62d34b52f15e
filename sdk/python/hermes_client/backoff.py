"""Reconnect pauses: full-jitter exponential backoff, with the edge's
Retry-After as a floor (docs/clients.md says why this shape). Times are
seconds. The same rules as the TypeScript SDK's src/backoff.ts."""

from __future__ import annotations

import calendar
import math
import re
import time
from typing import Callable, Iterable, Optional, Union

#: The largest pause the client ever takes, seconds (5 minutes), whatever Retry-After says.
MAX_RETRY_AFTER = 300.0

Random = Callable[[], float]
"""A random number in [0, 1): random.random, or a seeded random.Random(seed).random in tests."""


def backoff_window(attempt: int, base: float, cap: float) -> float:
    """The top of attempt's jitter window: min(cap, base * 2**attempt)."""
    if not base > 0 or not cap > 0:
        return 0.0
    n = max(0, int(attempt))
    if n >= 1024:  # 2**n as a float overflows; the cap holds then too
        return float(cap)
    return float(min(cap, base * 2.0 ** n))


def _unit(random: Random) -> float:
    r = random()
    # A random source outside [0, 1) must not push a pause past its bounds.
    return min(max(r, 0.0), 1.0) if isinstance(r, (int, float)) and math.isfinite(r) else 0.0


def full_jitter(attempt: int, base: float, cap: float, random: Random) -> float:
    """AWS's full jitter: uniform in [0, min(cap, base * 2**attempt))."""
    return _unit(random) * backoff_window(attempt, base, cap)


def retry_delay(attempt: int, base: float, cap: float, random: Random, floor: Optional[float] = None,
                max_delay: float = MAX_RETRY_AFTER) -> float:
    """The pause before the next connection attempt:
    floor + random * min(cap, base * 2**attempt), at most max_delay. floor is
    the Retry-After of a 503 or 429; without it, plain full jitter."""
    lo = floor if floor is not None and floor > 0 else 0.0
    return min(max_delay, lo + full_jitter(attempt, base, cap, random))


_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
# RFC 9110 5.6.7: IMF-fixdate, and the obsolete RFC 850 and asctime forms a recipient must accept.
_IMF_FIXDATE = re.compile(r"[a-z]{3}, (\d{2}) ([a-z]{3}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) gmt", re.I | re.A)
_RFC850 = re.compile(r"[a-z]{6,9}, (\d{2})-([a-z]{3})-(\d{2}) (\d{2}):(\d{2}):(\d{2}) gmt", re.I | re.A)
_ASCTIME = re.compile(r"[a-z]{3} ([a-z]{3}) ([ \d]\d) (\d{2}):(\d{2}):(\d{2}) (\d{4})", re.I | re.A)


def _utc(year: int, mon: str, day: int, h: int, m: int, s: int) -> Optional[float]:
    mon = mon.lower()
    if mon not in _MONTHS or not 1 <= day <= 31 or h > 23 or m > 59 or s > 60:
        return None
    try:
        return float(calendar.timegm((year, _MONTHS.index(mon) + 1, day, h, m, min(s, 59), 0, 0, 0)))
    except (OverflowError, ValueError):
        return None


def parse_http_date(value: str, now: Optional[float] = None) -> Optional[float]:
    """An HTTP-date (RFC 9110) as seconds since the epoch; None when it is not one."""
    v = value.strip()
    m = _IMF_FIXDATE.fullmatch(v)
    if m:
        return _utc(int(m[3]), m[2], int(m[1]), int(m[4]), int(m[5]), int(m[6]))
    m = _RFC850.fullmatch(v)
    if m:
        # Two-digit years: the nearest century, as RFC 9110 asks (no more than 50 years ahead).
        year = 2000 + int(m[3])
        if year > time.gmtime(time.time() if now is None else now).tm_year + 50:
            year -= 100
        return _utc(year, m[2], int(m[1]), int(m[4]), int(m[5]), int(m[6]))
    m = _ASCTIME.fullmatch(v)
    if m:
        return _utc(int(m[6]), m[1], int(m[2].strip()), int(m[3]), int(m[4]), int(m[5]))
    return None


def parse_retry_after(value: Union[str, Iterable[str], None], now: Optional[float] = None) -> Optional[float]:
    """A Retry-After header's value as a pause in seconds: delay-seconds
    ("5") or an HTTP-date (the time left until then, 0 when it is past).
    Anything else (empty, negative, a fraction, garbage) is None: ignored.
    Of repeated headers, the first counts."""
    if value is not None and not isinstance(value, str):
        value = next(iter(value), None)
    if not isinstance(value, str):
        return None
    v = value.strip()
    if re.fullmatch(r"\d+", v, re.A):
        # More digits than a float holds: a very long wait, which the cap bounds.
        return float(v)
    t = parse_http_date(v, now)
    if t is None:
        return None
    return max(0.0, t - (time.time() if now is None else now))
