package memstore

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// pushTarget is one device's registered push endpoint.
type pushTarget struct {
	expiry
	device string
	data   []byte
}

// pushTargets keeps the push endpoints by device.
type pushTargets struct {
	mu       sync.Mutex
	byDevice map[string]*pushTarget
	byExpiry expiryQueue[*pushTarget]
}

// SetPushTarget records target for device for ttl.
func (s *Store) SetPushTarget(ctx context.Context, device string, target []byte, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return errBadTTL
	}
	p := &s.pushTo
	now := s.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(now)
	if p.byDevice == nil {
		p.byDevice = make(map[string]*pushTarget)
	}
	if e, ok := p.byDevice[device]; ok {
		e.data, e.at = bytes.Clone(target), now.Add(ttl)
		p.byExpiry.fix(e)
		return nil
	}
	e := &pushTarget{expiry: expiry{at: now.Add(ttl)}, device: device, data: bytes.Clone(target)}
	p.byDevice[device] = e
	p.byExpiry.add(e)
	return nil
}

// PushTarget returns device's target; store.ErrNotFound when none.
func (s *Store) PushTarget(ctx context.Context, device string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := &s.pushTo
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(s.clock.Now())
	e, ok := p.byDevice[device]
	if !ok {
		return nil, store.ErrNotFound
	}
	return bytes.Clone(e.data), nil
}

// DeletePushTarget forgets device's target.
func (s *Store) DeletePushTarget(ctx context.Context, device string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p := &s.pushTo
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.byDevice[device]; ok {
		delete(p.byDevice, device)
		p.byExpiry.remove(e)
	}
	return nil
}

func (p *pushTargets) expire(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(now)
}

func (p *pushTargets) expireLocked(now time.Time) {
	for {
		e, ok := p.byExpiry.popExpired(now)
		if !ok {
			return
		}
		delete(p.byDevice, e.device)
	}
}
