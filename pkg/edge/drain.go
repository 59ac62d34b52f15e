package edge

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// Drain takes the edge out of service without a thundering herd. It stops
// accepting (the listeners close), then closes the connections with 1001
// (going away) one by one, spread evenly over window with jitter, so their
// phones reconnect to other edges a few at a time.
//
// Nothing a connection was doing is cut off. The frame it is handling is
// finished first: an event being handed to a router is either taken by it
// or refused (and the phone told), never abandoned in between. Frames
// already queued for the socket are written before the close frame, and a
// delivery written there is acknowledged as usual. A delivery that arrives
// once the connection is closing is answered "moved", so the router looks
// for the device's new edge; when the socket is gone the device's owner
// record is released, and outputs go to its outbox until it reconnects.
//
// Drain returns when every connection is closed, no frame is being handled
// and the devices' owner records are released, or with ctx's error when ctx ends first (the connections not
// closed yet then get their close frame at once). Close follows Drain.
func (s *Server) Drain(ctx context.Context, window time.Duration) error {
	conns, ok := s.stopAccepting(&s.draining)
	if !ok {
		return nil
	}
	s.tel.m.setDraining(1)
	s.log.Info("draining", "conns", len(conns), "window", window.String())

	var closing sync.WaitGroup
	start := time.Now()
	offsets := drainSchedule(len(conns), window, rand.N[time.Duration])
	hurry := false
	for i, c := range conns {
		if !hurry {
			at := start.Add(offsets[i])
			select {
			case <-ctx.Done():
				hurry = true
			case <-time.After(time.Until(at)):
			}
		}
		if !c.isClosing() { // else the phone or the edge is closing it already
			closing.Go(c.drainClose)
		}
	}
	done := make(chan struct{})
	go func() {
		closing.Wait()
		for _, c := range conns {
			<-c.dead
		}
		s.releasing.Wait() // the owner records are released
		close(done)
	}()
	select {
	case <-done:
		s.log.Info("drained", "took", time.Since(start).Round(time.Millisecond).String())
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drainSchedule returns when, from the start of a drain, each of n
// connections closes: connection i at a random moment (rnd(k) is uniform in
// [0, k)) of the i-th of n equal slots of window, so the offsets grow with i,
// none passes window, and each slot holds one close.
func drainSchedule(n int, window time.Duration, rnd func(time.Duration) time.Duration) []time.Duration {
	slot := window / time.Duration(max(n, 1))
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = slot*time.Duration(i) + rnd(slot+1)
	}
	return out
}

// isDraining reports whether Drain has begun.
func (s *Server) isDraining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

// drainClose closes c with 1001 once the frame it is handling, if any, is
// finished; after the close frame is queued no further frame is handled.
func (c *conn) drainClose() {
	c.handleMu.Lock()
	defer c.handleMu.Unlock()
	if c.cron != nil {
		c.cron.wait() // the deliver frames taken are answered first
	}
	c.closeWith(closeGoingAway, "server shutting down; reconnect", nil)
}
