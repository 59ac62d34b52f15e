package admin

import (
	"context"
	"errors"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/store"
)

// readySubject is asked by BusCheck: nobody listens on it, so a bus that
// works answers "no responders" at once.
const readySubject = "hermes.readyz"

// StoreCheck passes when the store answers a read (Redis is reachable).
func StoreCheck(st store.Owners) Check {
	return func(ctx context.Context) error {
		// Any device will do: not found is an answer.
		if _, err := st.DeviceOwner(ctx, "readyz-probe"); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return nil
	}
}

// BusCheck passes when a request makes the round trip through the bus's
// server (NATS is reachable).
func BusCheck(b bus.Bus) Check {
	return func(ctx context.Context) error {
		if _, err := b.Request(ctx, readySubject, nil, nil); err != nil && !errors.Is(err, bus.ErrNoResponders) {
			return err
		}
		return nil
	}
}

// BusLive is the liveness check of a bus that can be closed for good
// (natsbus: nats.go gave up on the connection); nil for one that cannot.
func BusLive(b bus.Bus) func() error {
	if e, ok := b.(interface{ Err() error }); ok {
		return e.Err
	}
	return nil
}
