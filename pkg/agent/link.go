package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// DefaultLinkMaxLen is how many events the log of a Link keeps when NewLink
// is given no bound.
const DefaultLinkMaxLen = 10000

// Retries of an append that failed because the store could not be reached.
const (
	linkRetryMin = 100 * time.Millisecond
	linkRetryMax = 5 * time.Second
)

// Link is the agent of AGENT=link: it hands the events to an agent outside
// the gateway (the Hermes plugin) by appending each one, as the JSON of its
// wire.Event, to the store's event log. The outside agent reads the log over
// the router's HTTP API (GET /v1/events) and answers through it; Link itself
// never speaks to the device.
//
// Device events come through Accept, which the router calls before it
// acknowledges the event to the edge: an event is acknowledged only once it
// is in the log. Handle gets what the router itself raises (a card's
// expiry) from the device's journal; as that is acknowledged to no one, a
// store that cannot be reached must not lose it: Handle retries the append,
// backing off up to 5 s, until it succeeds or ctx ends (the router's
// per-event timeout, or its shutdown).
type Link struct {
	events store.Events
	maxLen int
}

var _ Agent = (*Link)(nil)

// NewLink returns a Link appending to ev, which keeps about maxLen events
// (DefaultLinkMaxLen when maxLen < 1); older ones are dropped, so an outside
// agent away for longer misses them.
func NewLink(ev store.Events, maxLen int) *Link {
	if maxLen < 1 {
		maxLen = DefaultLinkMaxLen
	}
	return &Link{events: ev, maxLen: maxLen}
}

// Handle appends ev to the event log.
func (l *Link) Handle(ctx context.Context, ev wire.Event, _ Output) error {
	data, err := wire.Marshal(ev)
	if err != nil {
		return fmt.Errorf("link: encoding the event: %w", err)
	}
	// Each owner's events go to a log of its own (its agent reads that
	// one); the legacy owner's to the log of before.
	owner := tenant.OwnerOf(ev.Device)
	delay := linkRetryMin
	for {
		var err error
		if owner == tenant.Legacy {
			_, err = l.events.AppendEvent(ctx, data, l.maxLen)
		} else {
			_, err = l.events.AppendEventIn(ctx, owner, data, l.maxLen)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, store.ErrUnavailable) {
			return fmt.Errorf("link: appending the event: %w", err)
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		if cerr := ctx.Err(); cerr != nil {
			if !errors.Is(err, cerr) {
				err = fmt.Errorf("%w, then %w", err, cerr)
			}
			return fmt.Errorf("link: appending the event: %w", err)
		}
		delay = min(2*delay, linkRetryMax)
	}
}

// Accept implements Acceptor: the event is in the log when it returns.
func (l *Link) Accept(ctx context.Context, ev wire.Event) error { return l.Handle(ctx, ev, nil) }
