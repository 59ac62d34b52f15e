package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
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
// meanwhile costs one "moved" answer and a second request.
const OwnerCacheTTL = time.Second

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
	until := clock.Or(c.Clock).Now().Add(OwnerCacheTTL)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= OwnerCacheSize {
		c.m = make(map[string]cachedOwner)
	}
	c.m[device] = cachedOwner{owner: o, until: until}
}

func (c *OwnerCache) drop(device string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	delete(c.m, device)
	c.mu.Unlock()
}

// owner returns device's owner from the cache (cached), or else the store.
func (d *Dispatcher) owner(ctx context.Context, device string) (o store.Owner, cached bool, err error) {
	if o, ok := d.Cache.get(device); ok {
		return o, true, nil
	}
	o, err = d.Owners.DeviceOwner(ctx, device)
	if err == nil {
		d.Cache.put(device, o)
	}
	return o, false, err
}
