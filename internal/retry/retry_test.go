package retry

import (
	"context"
	"math"
	"testing"
	"time"
)

// TestBackoffGrowsToMax: the waits double within ±25 % and stop at max
// (±25 %); Reset starts again.
func TestBackoffGrowsToMax(t *testing.T) {
	b := New(100*time.Millisecond, time.Second)
	want := 100 * time.Millisecond
	for i := range 8 {
		d := b.Next()
		if d < want*3/4 || d > want*5/4 {
			t.Fatalf("wait %d = %v, want %v ± 25 %%", i, d, want)
		}
		want = min(2*want, time.Second)
	}
	b.Reset()
	if d := b.Next(); d > 125*time.Millisecond {
		t.Fatalf("after Reset the wait is %v, want about 100ms", d)
	}
}

// TestWaitEndsWithContext: a wait of an hour returns false as soon as its
// context is cancelled.
func TestWaitEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool)
	go func() { done <- Sleep(ctx, time.Hour) }()
	cancel()
	if <-done {
		t.Fatal("Sleep reported a full wait after its context was cancelled")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("a short Sleep reported its context ended")
	}
}

// TestEveryLetsOnePerInterval: the first event passes, the next ones within
// the interval do not, and Reset lets the next one through.
func TestEveryLetsOnePerInterval(t *testing.T) {
	e := Every{Interval: time.Hour}
	if !e.Allow() {
		t.Fatal("the first event was held back")
	}
	if e.Allow() {
		t.Fatal("a second event within the interval was let through")
	}
	e.Reset()
	if !e.Allow() {
		t.Fatal("the first event after Reset was held back")
	}
	var always Every
	for i := range 2 {
		if !always.Allow() {
			t.Fatalf("the zero Every held event %d back", i+1)
		}
	}
}

// TestFullJitter: each wait of a full-jitter Backoff lies in [0, c], c
// doubling from initial to max and never past it, and the waits spread
// over the whole interval: of 2,000 first waits some fall in its lowest
// tenth and some in its highest.
func TestFullJitter(t *testing.T) {
	b := Full(100*time.Millisecond, time.Second)
	ceiling := 100 * time.Millisecond
	for i := range 8 {
		if d := b.Next(); d < 0 || d > ceiling {
			t.Fatalf("wait %d = %v, want within [0, %v]", i, d, ceiling)
		}
		ceiling = min(2*ceiling, time.Second)
	}
	low, high := false, false
	for range 2000 {
		b.Reset()
		d := b.Next()
		if d < 0 || d > 100*time.Millisecond {
			t.Fatalf("a first wait of %v, want within [0, 100ms]", d)
		}
		low = low || d < 10*time.Millisecond
		high = high || d > 90*time.Millisecond
	}
	if !low || !high {
		t.Fatalf("2,000 first waits: one under 10ms %v, one over 90ms %v; want both (full jitter)", low, high)
	}
}

// TestRetryAfter: delay-seconds and HTTP-dates (the three forms RFC 9110
// accepts), a date past is 0, and what is malformed asks for nothing.
func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"120", 120 * time.Second, true},
		{" 0 ", 0, true},
		{"Sun, 01 Mar 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Sunday, 01-Mar-26 12:01:00 GMT", time.Minute, true},
		{"Sun Mar  1 12:00:05 2026", 5 * time.Second, true},
		{"Sun, 01 Mar 2026 11:00:00 GMT", 0, true},
		{"99999999999999999999", time.Duration(math.MaxInt64), true},
		{"", 0, false},
		{"-5", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
	} {
		got, ok := RetryAfter(tc.v, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("RetryAfter(%q) = %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}
