package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// OwnerCache remembers the owners a Dispatcher read, for OwnerCacheTTL, so
// that the outputs of one answer (typing, the message's parts, the avatar)
// cost one owner read instead of one each. A cached owner may be stale: it
// is only the epoch the request carries, marked wire.Output.Cached, and
// the edges fence it (the device's newer socket answers "moved", which
// drops the entry and reads again; the edge at the cached epoch writes
// only once the owner record confirms it, since the newer socket's
// takeover notice may not have reached it yet; see pkg/edge's
// onDelivery). Entries are dropped on any answer but a delivery. It holds at most OwnerCacheSize devices; past that it starts
// over. Safe for concurrent use; the zero value is ready.
type OwnerCache struct {
	Clock clock.Clock // nil: the system clock

	mu sync.Mutex
	m  map[string]cachedOwner
}

type cachedOwner struct {
	owner store.Owner
	until time.Time
}

// OwnerCacheTTL is how long a read owner is used. An owner that changed
// meanwhile costs one "moved" answer and a second request; a cached owner
// is fenced by the edge's own read of the record, so the TTL bounds only
// how often the router reads it (at 1 s, a tenth of 10,000 deliveries a
// second to 1,000 phones read it).
const OwnerCacheTTL = 10 * time.Second

// OwnerCacheSize bounds the devices remembered (about 100 B each).
const OwnerCacheSize = 100_000

func (c *OwnerCache) get(device string) (store.Owner, bool) {
	if c == nil {
		return store.Owner{}, false
	}
	now := clock.Or(c.Clock).Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[device]
	if !ok || !now.Before(e.until) {
		return store.Owner{}, false
	}
	return e.owner, true
}

func (c *OwnerCache) put(device string, o store.Owner) {
	if c == nil {
		return
	}
	c.keep(device, o, false)
}

// Seed remembers o as device's owner, as a read would, unless a fresher
// entry names a later epoch: for an owner known without reading it (the
// edge and socket epoch an event came through, whose answer follows).
// Like any cached owner it may be stale; the edges fence it.
func (c *OwnerCache) Seed(device string, o store.Owner) {
	if c == nil || o.Edge == "" || o.Epoch == 0 {
		return
	}
	c.keep(device, o, true)
}

// keep remembers o as device's owner for OwnerCacheTTL; with unlessNewer,
// not over a fresh entry of a later (or the same) epoch.
func (c *OwnerCache) keep(device string, o store.Owner, unlessNewer bool) {
	now := clock.Or(c.Clock).Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[device]; unlessNewer && ok && now.Before(e.until) && e.owner.Epoch >= o.Epoch {
		return
	}
	if c.m == nil || len(c.m) >= OwnerCacheSize {
		c.m = make(map[string]cachedOwner)
	}
	c.m[device] = cachedOwner{owner: o, until: now.Add(OwnerCacheTTL)}
}

func (c *OwnerCache) drop(device string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	delete(c.m, device)
	c.mu.Unlock()
}

// Which edge holds a device, for every sender (Send, Publish, Notify, the
// batches, an edge's takeover notice through NotifyAt): the owner record,
// read here (owner, owners, route), and the subjects of the edge it names
// (outputSubject, batchSubject; deviceSubject for an edge of the release
// before edge subjects).

// owner returns device's owner from the cache (cached), or else (or when
// fresh: a notice, which must reach the owner now) the store.
func (d *Dispatcher) owner(ctx context.Context, device string, fresh bool) (o store.Owner, cached bool, err error) {
	if !fresh {
		if o, ok := d.Cache.get(device); ok {
			return o, true, nil
		}
	}
	o, err = d.Owners.DeviceOwner(ctx, device)
	if err == nil {
		d.Cache.put(device, o)
	}
	return o, false, err
}

// owners returns the owners of devices, in order, in one store round trip;
// an owner of epoch 0 is none (the device is offline).
func (d *Dispatcher) owners(ctx context.Context, devices []string) ([]store.Owner, error) {
	return d.Owners.DeviceOwners(ctx, devices)
}

// route returns the owner out goes to: the device's owner record (from
// the Cache while fresh), or, when there is none but out.Via names the
// edge the device's event just came through, that edge at epoch 0. The
// store may have lost the record (a Redis restart): epoch 0 has that edge
// write out to whatever socket of the device it holds (and claim the
// device again); none there is offline. store.ErrNotFound when neither.
func (d *Dispatcher) route(ctx context.Context, out wire.Output) (o store.Owner, cached bool, err error) {
	o, cached, err = d.owner(ctx, out.Device, false)
	if errors.Is(err, store.ErrNotFound) && out.Via != "" {
		return store.Owner{Edge: out.Via}, false, nil
	}
	return o, cached, err
}

// outputSubject is the subject where the edge that owner names hears the
// outputs and notices for the devices it holds.
func outputSubject(owner store.Owner) string {
	return bus.EdgeOutputSubject(owner.Edge)
}

// batchSubject is the subject where edge hears batches of outputs
// (wire.Batch) for the devices it holds.
func batchSubject(edge string) string {
	return bus.EdgeSubject(edge)
}

// deviceSubject is the subject where an edge of the release before edge
// subjects hears device's outputs and notices.
//
// shim(v0.2.0): device subjects.
func deviceSubject(device string) string {
	return bus.DeviceSubject(device)
}
