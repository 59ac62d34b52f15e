// Reconnect pauses: full-jitter exponential backoff, with the edge's
// Retry-After as a floor. docs/clients.md says why this shape.

/** The largest pause the client ever takes, ms (5 minutes), whatever Retry-After says. */
export const MAX_RETRY_AFTER = 5 * 60 * 1000;

/** A random number in [0, 1): Math.random, or a seeded source in tests. */
export type Random = () => number;

/** The top of attempt's jitter window: min(cap, base × 2^attempt), ms. */
export function backoffWindow(attempt: number, base: number, cap: number): number {
  if (!(base > 0) || !(cap > 0)) return 0;
  const n = Math.max(0, Math.floor(attempt));
  // 2^n overflows to Infinity past n = 1023: the cap holds then too.
  return Math.min(cap, base * 2 ** Math.min(n, 1023));
}

/** AWS's full jitter: uniform in [0, min(cap, base × 2^attempt)), ms. */
export function fullJitter(attempt: number, base: number, cap: number, random: Random = Math.random): number {
  return unit(random) * backoffWindow(attempt, base, cap);
}

export interface RetryDelayOptions {
  /** Failed attempts in a row before this one (0 for the first retry). */
  attempt: number;
  /** The first window and the largest one, ms (the client's minDelay and maxDelay). */
  base: number;
  cap: number;
  /**
   * The pause the edge asked for (Retry-After of a 503 or 429), or the one
   * assumed where the status cannot be seen, ms: the pause is at least
   * this, plus the attempt's full jitter on top.
   */
  floor?: number;
  /** No pause is longer than this, ms (default MAX_RETRY_AFTER). */
  max?: number;
}

/**
 * The pause before the next connection attempt, ms:
 * floor + random × min(cap, base × 2^attempt), at most max. Without a
 * floor it is plain full jitter.
 */
export function retryDelay(o: RetryDelayOptions, random: Random = Math.random): number {
  const max = o.max ?? MAX_RETRY_AFTER;
  const floor = o.floor !== undefined && o.floor > 0 ? o.floor : 0;
  return Math.min(max, floor + fullJitter(o.attempt, o.base, o.cap, random));
}

const MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
// RFC 9110 5.6.7: IMF-fixdate, and the obsolete RFC 850 and asctime forms a recipient must accept.
const IMF_FIXDATE = /^[a-z]{3}, (\d{2}) ([a-z]{3}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) gmt$/i;
const RFC850 = /^[a-z]{6,9}, (\d{2})-([a-z]{3})-(\d{2}) (\d{2}):(\d{2}):(\d{2}) gmt$/i;
const ASCTIME = /^[a-z]{3} ([a-z]{3}) ([ \d]\d) (\d{2}):(\d{2}):(\d{2}) (\d{4})$/i;

function utc(year: number, mon: string, day: number, h: number, m: number, s: number): number | undefined {
  const month = MONTHS.indexOf(mon.toLowerCase());
  if (month < 0 || day < 1 || day > 31 || h > 23 || m > 59 || s > 60) return undefined;
  const t = Date.UTC(year, month, day, h, m, s);
  return Number.isFinite(t) ? t : undefined;
}

/** An HTTP-date (RFC 9110) as ms since the epoch; undefined when it is not one. */
export function parseHTTPDate(value: string, now: number = Date.now()): number | undefined {
  const v = value.trim();
  let m = IMF_FIXDATE.exec(v);
  if (m) return utc(+m[3], m[2], +m[1], +m[4], +m[5], +m[6]);
  if ((m = RFC850.exec(v))) {
    // Two-digit years: the nearest century, as RFC 9110 asks (no more than 50 years ahead).
    let year = 2000 + +m[3];
    if (year > new Date(now).getUTCFullYear() + 50) year -= 100;
    return utc(year, m[2], +m[1], +m[4], +m[5], +m[6]);
  }
  if ((m = ASCTIME.exec(v))) return utc(+m[6], m[1], +m[2].trim(), +m[3], +m[4], +m[5]);
  return undefined;
}

/**
 * A Retry-After header's value as a pause, ms: delay-seconds ("5") or an
 * HTTP-date (the time left until then, 0 when it is past). Anything else
 * (empty, negative, a fraction, garbage) is undefined: ignored.
 */
export function parseRetryAfter(value: string | string[] | null | undefined, now: number = Date.now()): number | undefined {
  if (Array.isArray(value)) value = value[0];
  if (typeof value !== "string") return undefined;
  const v = value.trim();
  // Digits past a double's range are Infinity: a very long wait, which the cap bounds.
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const t = parseHTTPDate(v, now);
  return t === undefined ? undefined : Math.max(0, t - now);
}

function unit(random: Random): number {
  const r = random();
  // A random source outside [0, 1) must not push a pause past its bounds.
  return Number.isFinite(r) ? Math.min(Math.max(r, 0), 1) : 0;
}
