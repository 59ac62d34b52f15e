// Package retry is the one backoff of the services: exponential with
// jitter (github.com/cenkalti/backoff/v5), and a wait that ends with its
// context, so no retry loop delays a shutdown.
package retry

import (
	"context"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Backoff hands out growing waits, from about initial up to about max
// (each randomized by ±25 %). It has no overall deadline: callers keep
// their own. Not safe for concurrent use.
type Backoff struct{ b *backoff.ExponentialBackOff }

// New returns a Backoff from initial to max, doubling.
func New(initial, max time.Duration) *Backoff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = initial
	b.MaxInterval = max
	b.Multiplier = 2
	b.RandomizationFactor = 0.25
	b.Reset()
	return &Backoff{b}
}

// Next is the next wait.
func (b *Backoff) Next() time.Duration { return b.b.NextBackOff() }

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
