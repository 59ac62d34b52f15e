package push

import (
	"context"
	"runtime"
	"testing"
)

// TestSlots: with 2 slots and 1 per host, a second request to a host
// waits while another host's goes; a freed slot goes to the first waiter
// that can use it, not to one whose host is still full; a waiter whose
// context ends leaves the queue and its slot to the next.
func TestSlots(t *testing.T) {
	ctx := t.Context()
	s := newSlots(2, 1)
	if err := s.acquire(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	a2 := wait(ctx, s, "a")
	if err := s.acquire(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	c := wait(ctx, s, "c")
	cancelled, cancel := context.WithCancel(ctx)
	d := wait(cancelled, s, "d")
	s.release("b") // a is still full: c goes
	if err := <-c; err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-d; err == nil {
		t.Fatal("a cancelled wait was granted")
	}
	s.release("a") // a's waiter goes
	if err := <-a2; err != nil {
		t.Fatal(err)
	}
	s.release("a")
	s.release("c")
	if s.free != 2 || len(s.busy) != 0 || len(s.waiting) != 0 {
		t.Fatalf("free %d, busy %v, waiting %d; want 2, none, none", s.free, s.busy, len(s.waiting))
	}
}

// wait starts acquire(ctx, host) and returns its result's channel once
// the request waits in the queue (or has its slot).
func wait(ctx context.Context, s *slots, host string) <-chan error {
	done := make(chan error, 1)
	before := queued(s)
	go func() { done <- s.acquire(ctx, host) }()
	for queued(s) == before && len(done) == 0 {
		// acquire either queues at once or returns; poll the state,
		// not the clock.
		runtime.Gosched()
	}
	return done
}

func queued(s *slots) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}
