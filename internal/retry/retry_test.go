package retry

import (
	"context"
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
