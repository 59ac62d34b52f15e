package main

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// The SDKs' reconnect pauses (docs/clients.md, "Reconnecting"):
//
//	pause = floor + random × min(backoffCap, backoffBase × 2^attempt)
//
// floor is a refused upgrade's Retry-After (0 after any other failure),
// random uniform in [0, 1), and no pause is longer than maxPause.
const (
	backoffBase = 500 * time.Millisecond
	backoffCap  = 30 * time.Second
	maxPause    = 5 * time.Minute
)

// backoff is one phone's reconnect pauses; attempt grows with each.
type backoff struct {
	attempt int
	rand    func() float64 // nil: math/rand/v2
}

// next is the pause before the next attempt, after a failure whose
// Retry-After was retryAfter (0: none).
func (b *backoff) next(retryAfter time.Duration) time.Duration {
	window := backoffCap
	if b.attempt < 16 {
		window = min(backoffCap, backoffBase<<b.attempt)
	}
	b.attempt++
	r := rand.Float64
	if b.rand != nil {
		r = b.rand
	}
	return min(retryAfter+time.Duration(r()*float64(window)), maxPause)
}

// parseRetryAfter reads a Retry-After of delay-seconds; an HTTP-date or
// anything else is 0 (the edge sends seconds).
func parseRetryAfter(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0
	}
	return min(time.Duration(n)*time.Second, maxPause)
}
