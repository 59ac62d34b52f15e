package memstore

import (
	"bytes"
	"context"
	"sort"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// outboxItem is one queued frame: its sequence number, bytes, device and
// deadline, queued in outboxes.byDeadline while it is kept.
type outboxItem struct {
	expiry
	device string
	seq    int64
	data   []byte
}

// outbox is the queue of one device, oldest first.
type outbox struct {
	items []*outboxItem
	bytes int // the sum of the items' lengths
}

// outboxes keeps the queues of offline devices. Sequence numbers come from
// one counter for all devices, so a device's numbers keep growing when its
// outbox is emptied and made again. Every item is in byDeadline, which
// expires items one by one and finds the store's oldest past
// MaxStoreBytes.
type outboxes struct {
	mu         sync.Mutex
	seq        int64 // the last sequence number handed out
	bytes      int64 // the sum of every item's length
	byDevice   map[string]*outbox
	byDeadline expiryQueue[*outboxItem]
}

func newOutboxes() outboxes {
	return outboxes{byDevice: make(map[string]*outbox)}
}

// PushOutbox appends item to device's outbox for lim.TTL and drops the
// oldest items past lim's bounds.
func (s *Store) PushOutbox(ctx context.Context, device string, item []byte, lim store.OutboxLimits) (store.OutboxDrops, error) {
	var d store.OutboxDrops
	if err := ctx.Err(); err != nil {
		return d, err
	}
	if lim.TTL <= 0 {
		return d, errBadTTL
	}
	item = bytes.Clone(item)
	q := &s.outbox
	now := s.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	d.Expired = q.expireLocked(now)
	switch {
	case lim.MaxItems < 1:
		b := q.byDevice[device]
		if b != nil {
			d.Full = len(b.items)
			for len(b.items) > 0 {
				q.dropLocked(b, 0)
			}
		}
		return d, nil
	case lim.MaxBytes > 0 && len(item) > lim.MaxBytes:
		d.Bytes = 1
		return d, nil
	case lim.MaxStoreBytes > 0 && int64(len(item)) > lim.MaxStoreBytes:
		d.Store = 1
		return d, nil
	}
	b := q.byDevice[device]
	if b == nil {
		b = &outbox{}
		q.byDevice[device] = b
	}
	q.seq++
	it := &outboxItem{expiry: expiry{at: now.Add(lim.TTL)}, device: device, seq: q.seq, data: item}
	b.items = append(b.items, it)
	b.bytes += len(item)
	q.bytes += int64(len(item))
	q.byDeadline.add(it)
	for len(b.items) > lim.MaxItems {
		q.dropLocked(b, 0)
		d.Full++
	}
	for lim.MaxBytes > 0 && b.bytes > lim.MaxBytes {
		q.dropLocked(b, 0)
		d.Bytes++
	}
	for lim.MaxStoreBytes > 0 && q.bytes > lim.MaxStoreBytes {
		first := q.byDeadline.first()
		ob := q.byDevice[first.device]
		q.dropLocked(ob, ob.index(first.seq))
		d.Store++
	}
	return d, nil
}

// index is the position of the item seq, which is in the outbox.
func (b *outbox) index(seq int64) int {
	return sort.Search(len(b.items), func(i int) bool { return b.items[i].seq >= seq })
}

// dropLocked removes b's i-th item, and b when it is left empty.
func (q *outboxes) dropLocked(b *outbox, i int) {
	it := b.items[i]
	q.byDeadline.remove(it)
	b.bytes -= len(it.data)
	q.bytes -= int64(len(it.data))
	copy(b.items[i:], b.items[i+1:])
	b.items[len(b.items)-1] = nil
	b.items = b.items[:len(b.items)-1]
	if len(b.items) == 0 {
		delete(q.byDevice, it.device)
	}
}

// PeekOutbox returns device's live items whose Seq is greater than after,
// oldest first, and leaves them in place.
func (s *Store) PeekOutbox(ctx context.Context, device string, after int64) ([]store.OutboxItem, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := &s.outbox
	now := s.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(now)
	b, ok := q.byDevice[device]
	if !ok {
		return nil, nil
	}
	var out []store.OutboxItem
	for _, it := range b.items {
		if it.seq > after {
			out = append(out, store.OutboxItem{Seq: it.seq, Data: bytes.Clone(it.data)})
		}
	}
	return out, nil
}

// AckOutbox removes device's items up to Seq upTo if device's owner record
// holds epoch. It holds the owners' mutex, then the outbox's, so no claim
// of the device can come between the check and the removal.
func (s *Store) AckOutbox(ctx context.Context, device string, epoch, upTo int64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	o, q := &s.owners, &s.outbox
	now := s.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(now)
	if e, ok := o.byDevice[device]; !ok || e.owner.Epoch != epoch {
		return false, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(now)
	b, ok := q.byDevice[device]
	for ok && len(b.items) > 0 && b.items[0].seq <= upTo {
		q.dropLocked(b, 0)
	}
	return true, nil
}

func (q *outboxes) expire(now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(now)
}

// expireLocked forgets the items whose deadline passed and reports how
// many.
func (q *outboxes) expireLocked(now time.Time) int {
	n := 0
	for {
		it, ok := q.byDeadline.popExpired(now)
		if !ok {
			return n
		}
		b := q.byDevice[it.device]
		q.dropLocked(b, b.index(it.seq))
		n++
	}
}

// len reports the devices with an outbox.
func (q *outboxes) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.byDevice)
}
