package memstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// ownerEntry is the owner record of one device.
type ownerEntry struct {
	expiry
	device string
	owner  store.Owner
}

// acksEntry records that a device acks.
type acksEntry struct {
	expiry
	device string
}

// owners records device owners. Epochs come from one counter for all
// devices, so an epoch is greater than every epoch handed out before for any
// device, and nothing needs to be kept for a device once its record expires.
type owners struct {
	mu       sync.Mutex
	epoch    int64 // the last epoch handed out
	byDevice map[string]*ownerEntry
	byExpiry expiryQueue[*ownerEntry]
	acks     map[string]*acksEntry // the devices that ack
	acksExp  expiryQueue[*acksEntry]
	// leases: each edge's lease (RenewEdge) and until when it lives; an
	// edge that ever held one is kept, lapsed, for leaseMemory, so that
	// its records read as none.
	leases map[string]lease
}

// lease is an edge's lease: it lives until alive, and is remembered until
// remember.
type lease struct{ alive, remember time.Time }

// leaseMemory is how long an edge that held a lease is remembered after
// its last renewal, as redisstore's edge:{E}:seen key.
const leaseMemory = 24 * time.Hour

func newOwners() owners {
	return owners{byDevice: make(map[string]*ownerEntry), acks: make(map[string]*acksEntry), leases: make(map[string]lease)}
}

// RenewEdge keeps edge's lease for ttl.
func (s *Store) RenewEdge(ctx context.Context, edge string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if ttl <= 0 {
		return false, errBadTTL
	}
	o := &s.owners
	now := s.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	l, ok := o.leases[edge]
	fresh := !ok || !now.Before(l.alive)
	o.leases[edge] = lease{alive: now.Add(ttl), remember: now.Add(leaseMemory)}
	return fresh, nil
}

// standsLocked reports whether e's record stands at now: its edge's lease
// lives, or its edge never held one. o.mu is held.
func (o *owners) standsLocked(e *ownerEntry, now time.Time) bool {
	l, ok := o.leases[e.owner.Edge]
	return !ok || now.Before(l.alive)
}

// ClaimDevice makes edge the owner of device for ttl and returns a new epoch.
func (s *Store) ClaimDevice(ctx context.Context, device, edge string, ttl time.Duration) (int64, error) {
	c, err := s.ClaimDeviceAcks(ctx, device, edge, ttl)
	return c.Epoch, err
}

// ClaimDeviceAcks is ClaimDevice that also reports whether device acks
// and the owner it replaced.
func (s *Store) ClaimDeviceAcks(ctx context.Context, device, edge string, ttl time.Duration) (store.Claim, error) {
	if err := ctx.Err(); err != nil {
		return store.Claim{}, err
	}
	if ttl <= 0 {
		return store.Claim{}, errBadTTL
	}
	o := &s.owners
	now := s.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(now)
	o.epoch++
	owner := store.Owner{Edge: edge, Epoch: o.epoch}
	var prev store.Owner
	if e, ok := o.byDevice[device]; ok {
		prev = e.owner
		e.owner, e.at = owner, now.Add(ttl)
		o.byExpiry.fix(e)
	} else {
		e := &ownerEntry{expiry: expiry{at: now.Add(ttl)}, device: device, owner: owner}
		o.byDevice[device] = e
		o.byExpiry.add(e)
	}
	_, acks := o.acks[device]
	q := &s.outbox // the owners' mutex, then the outboxes' (see the package comment)
	q.mu.Lock()
	b := q.byDevice[device]
	outbox := b != nil && len(b.items) > 0
	q.mu.Unlock()
	return store.Claim{Epoch: o.epoch, Acks: acks, Prev: prev, Outbox: outbox}, nil
}

// SetDeviceAcks records for ttl that device acks.
func (s *Store) SetDeviceAcks(ctx context.Context, device string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return errBadTTL
	}
	o := &s.owners
	at := s.clock.Now().Add(ttl)
	o.mu.Lock()
	defer o.mu.Unlock()
	if e, ok := o.acks[device]; ok {
		e.at = at
		o.acksExp.fix(e)
		return nil
	}
	e := &acksEntry{expiry: expiry{at: at}, device: device}
	o.acks[device] = e
	o.acksExp.add(e)
	return nil
}

// DeviceOwner returns the owner of device; store.ErrNotFound when none.
func (s *Store) DeviceOwner(ctx context.Context, device string) (store.Owner, error) {
	if err := ctx.Err(); err != nil {
		return store.Owner{}, err
	}
	o := &s.owners
	now := s.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(now)
	e, ok := o.byDevice[device]
	if !ok || !o.standsLocked(e, now) {
		return store.Owner{}, store.ErrNotFound
	}
	return e.owner, nil
}

// DeviceOwners returns the owner of each device, in order; the zero Owner
// for a device that has none.
func (s *Store) DeviceOwners(ctx context.Context, devices []string) ([]store.Owner, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := &s.owners
	now := s.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(now)
	owners := make([]store.Owner, len(devices))
	for i, d := range devices {
		if e, ok := o.byDevice[d]; ok && o.standsLocked(e, now) {
			owners[i] = e.owner
		}
	}
	return owners, nil
}

// RefreshDevices extends the ownership of each device still held at the
// given epoch for ttl and returns the others, sorted.
func (s *Store) RefreshDevices(ctx context.Context, owned map[string]int64, ttl time.Duration) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ttl <= 0 {
		return nil, errBadTTL
	}
	o := &s.owners
	now := s.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(now)
	var lost []string
	for device, epoch := range owned {
		e, ok := o.byDevice[device]
		if !ok || e.owner.Epoch != epoch {
			lost = append(lost, device)
			continue
		}
		e.at = now.Add(ttl)
		o.byExpiry.fix(e)
	}
	slices.Sort(lost)
	return lost, nil
}

// ReleaseDevice removes the owner record of device if it holds epoch.
func (s *Store) ReleaseDevice(ctx context.Context, device string, epoch int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	o := &s.owners
	o.mu.Lock()
	defer o.mu.Unlock()
	if e, ok := o.byDevice[device]; ok && e.owner.Epoch == epoch {
		delete(o.byDevice, device)
		o.byExpiry.remove(e)
	}
	return nil
}

// expire is the sweeper's: what expireLocked does, and the edges no
// longer remembered (not on every read: a read needs only the lease of
// its record's edge).
func (o *owners) expire(now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(now)
	for edge, l := range o.leases { // a handful: one per edge
		if !now.Before(l.remember) {
			delete(o.leases, edge)
		}
	}
}

func (o *owners) expireLocked(now time.Time) {
	for {
		e, ok := o.byExpiry.popExpired(now)
		if !ok {
			break
		}
		delete(o.byDevice, e.device)
	}
	for {
		e, ok := o.acksExp.popExpired(now)
		if !ok {
			return
		}
		delete(o.acks, e.device)
	}
}

// len reports the owner and acks records, expired ones included until
// they are swept.
func (o *owners) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.byDevice) + len(o.acks)
}
