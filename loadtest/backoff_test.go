package main

import (
	"testing"
	"time"
)

// TestBackoff: full jitter under a doubling window, on top of Retry-After,
// capped; the window's ends at each attempt.
func TestBackoff(t *testing.T) {
	for _, tc := range []struct {
		attempt    int
		retryAfter time.Duration
		r          float64
		want       time.Duration
	}{
		{0, 0, 0, 0},
		{0, 0, 0.999, 499500 * time.Microsecond},
		{1, 0, 0.5, 500 * time.Millisecond},
		{3, 0, 0.5, 2 * time.Second},
		{10, 0, 0.5, 15 * time.Second}, // the window is capped at 30 s
		{0, 5 * time.Second, 0, 5 * time.Second},
		{2, 5 * time.Second, 0.5, 6 * time.Second},
		{40, 299 * time.Second, 0.999, maxPause},
	} {
		b := backoff{attempt: tc.attempt, rand: func() float64 { return tc.r }}
		if got := b.next(tc.retryAfter); got != tc.want {
			t.Errorf("attempt %d, Retry-After %v, random %v: pause %v, want %v", tc.attempt, tc.retryAfter, tc.r, got, tc.want)
		}
		if b.attempt != tc.attempt+1 {
			t.Errorf("attempt %d did not grow", tc.attempt)
		}
	}
	for v, want := range map[string]time.Duration{"3": 3 * time.Second, " 60 ": time.Minute, "-1": 0, "soon": 0,
		"Wed, 21 Oct 2015 07:28:00 GMT": 0, "100000": maxPause} {
		if got := parseRetryAfter(v); got != want {
			t.Errorf("Retry-After %q: %v, want %v", v, got, want)
		}
	}
}
