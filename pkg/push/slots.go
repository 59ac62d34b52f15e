package push

import (
	"context"
	"slices"
	"sync"
)

// slots bounds the requests in flight: at most total at once, at most
// perHost to one endpoint (scheme://host:port), or the endpoint's own
// limit (a push service's). A request for an endpoint
// at its bound waits without holding a slot, so endpoints that hang hold
// perHost slots each and never delay a request to another endpoint while
// slots are left; waiters are let go in arrival order among those that
// can go.
type slots struct {
	mu      sync.Mutex
	free    int
	perHost int
	limits  map[string]int // endpoints bounded otherwise than by perHost
	busy    map[string]int
	waiting []*slotWaiter // none of them could go: free is 0 or its host is full
}

type slotWaiter struct {
	host  string
	ready chan struct{}
}

func newSlots(total, perHost int) *slots {
	return &slots{free: total, perHost: perHost, busy: make(map[string]int), limits: make(map[string]int)}
}

// limit bounds host's requests in flight to n instead of perHost. Call it
// before the first acquire.
func (s *slots) limit(host string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits[host] = n
}

// acquire takes a slot for host, waiting until one is free; ctx's error
// when ctx ends first.
func (s *slots) acquire(ctx context.Context, host string) error {
	s.mu.Lock()
	if s.canGo(host) {
		s.take(host)
		s.mu.Unlock()
		return nil
	}
	w := &slotWaiter{host: host, ready: make(chan struct{})}
	s.waiting = append(s.waiting, w)
	s.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		if i := slices.Index(s.waiting, w); i >= 0 {
			s.waiting = slices.Delete(s.waiting, i, i+1)
			s.mu.Unlock()
			return ctx.Err()
		}
		s.mu.Unlock()
		s.release(host) // granted meanwhile
		return ctx.Err()
	}
}

// release gives host's slot back and lets go the waiters that now can.
func (s *slots) release(host string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free++
	if s.busy[host]--; s.busy[host] <= 0 {
		delete(s.busy, host)
	}
	kept := s.waiting[:0]
	for _, w := range s.waiting {
		if s.canGo(w.host) {
			s.take(w.host)
			close(w.ready)
			continue
		}
		kept = append(kept, w)
	}
	clear(s.waiting[len(kept):])
	s.waiting = kept
}

func (s *slots) canGo(host string) bool {
	bound, ok := s.limits[host]
	if !ok {
		bound = s.perHost
	}
	return s.free > 0 && s.busy[host] < bound
}

func (s *slots) take(host string) {
	s.free--
	s.busy[host]++
}
