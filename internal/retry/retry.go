// Package retry is the one backoff of the services: exponential with
// jitter (github.com/cenkalti/backoff/v5), and a wait that ends with its
// context, so no retry loop delays a shutdown.
package retry

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Backoff hands out growing waits, from about initial up to about max
// (each randomized by ±25 %, or with full jitter, see Full). It has no
// overall deadline: callers keep their own. Not safe for concurrent use.
type Backoff struct {
	b    *backoff.ExponentialBackOff
	full bool
}

// New returns a Backoff from initial to max, doubling.
func New(initial, max time.Duration) *Backoff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = initial
	b.MaxInterval = max
	b.Multiplier = 2
	b.RandomizationFactor = 0.25
	b.Reset()
	return &Backoff{b: b}
}

// Full returns a Backoff of full jitter: the n-th wait is drawn uniformly
// from [0, c], c doubling from initial up to max (initial, 2·initial, …,
// max). Callers that failed together (one endpoint's many clients, or one
// client's many requests to a server that was down) spread their retries
// over the whole interval instead of arriving together.
func Full(initial, max time.Duration) *Backoff {
	b := New(initial, max)
	b.b.RandomizationFactor = 0
	b.full = true
	b.Reset()
	return b
}

// Next is the next wait.
func (b *Backoff) Next() time.Duration {
	d := b.b.NextBackOff()
	if b.full && d > 0 {
		d = rand.N(d + 1)
	}
	return d
}

// RetryAfter is the wait an HTTP Retry-After header value asks for (RFC
// 9110 section 10.2.3): a number of seconds, or an HTTP-date taken
// relative to now (a date already past is 0). ok is false for an empty or
// malformed value, which asks for nothing. Callers bound what they are
// willing to wait.
func RetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if ne, isNum := err.(*strconv.NumError); isNum && ne.Err == strconv.ErrRange {
				return time.Duration(math.MaxInt64), true
			}
			return 0, false
		}
		if n > uint64(math.MaxInt64/int64(time.Second)) {
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// Reset starts again from initial.
func (b *Backoff) Reset() { b.b.Reset() }

// Wait sleeps the next wait; false when ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool { return Sleep(ctx, b.Next()) }

// Sleep waits d; false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Every lets the first event through, then at most one per interval: a
// retry loop logs its failures this way, the first at once, without a line
// per attempt. The zero Every lets everything through. Safe for concurrent
// use.
type Every struct {
	Interval time.Duration

	mu   sync.Mutex
	last time.Time
}

// Allow reports whether this event is let through.
func (e *Every) Allow() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if !e.last.IsZero() && now.Sub(e.last) < e.Interval {
		return false
	}
	e.last = now
	return true
}

// Reset lets the next event through: the retries are over.
func (e *Every) Reset() {
	e.mu.Lock()
	e.last = time.Time{}
	e.mu.Unlock()
}
