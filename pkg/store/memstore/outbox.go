package memstore

import (
	"bytes"
	"container/heap"
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// outboxItem is one queued frame: its sequence number, bytes and deadline,
// queued in outboxes.byDeadline while it is kept, in its device's outbox
// and in the holding it is charged to.
type outboxItem struct {
	expiry
	seq        int64
	data       []byte
	box        *outbox     // its device's queue
	held       *holding    // its device within its share
	prev, next *outboxItem // the holding's items, oldest first
}

// outbox is the queue of one device, oldest first.
type outbox struct {
	device string
	items  []*outboxItem
	bytes  int // the sum of the items' lengths
}

// holding is what one device holds within one share: its items charged to
// the share, oldest first, and their bytes.
type holding struct {
	device      string
	share       *share
	bytes       int64
	first, last *outboxItem
	index       int // in share.devices
}

// share is one holder above the devices (store.OutboxLimits.Share): its
// devices by the bytes they hold in it, largest first.
type share struct {
	name     string
	bytes    int64
	byDevice map[string]*holding
	devices  byWeight[*holding]
	index    int // in outboxes.largest
}

func (h *holding) weight() int64 { return h.bytes }
func (h *holding) slot() *int    { return &h.index }
func (s *share) weight() int64   { return s.bytes }
func (s *share) slot() *int      { return &s.index }

// outboxes keeps the queues of offline devices. Sequence numbers come from
// one counter for all devices, so a device's numbers keep growing when its
// outbox is emptied and made again. Every item is in byDeadline, which
// expires items one by one, and in its holding, through which the
// store-wide bounds find the largest holder's oldest.
//
// Two store-wide bounds drop in that order: the caller's MaxStoreBytes,
// on the items' lengths (the contract both stores keep), and maxCost, on
// what the outboxes cost this process in memory (see cost.go).
type outboxes struct {
	mu         sync.Mutex
	seq        int64 // the last sequence number handed out
	bytes      int64 // the sum of every item's length
	cost       int64 // the memory every item, device, holding and share costs
	maxCost    int64 // bound of cost; 0: none
	byDevice   map[string]*outbox
	byDeadline expiryQueue[*outboxItem]
	shares     map[string]*share
	largest    byWeight[*share]
}

func newOutboxes(maxCost int64) outboxes {
	return outboxes{byDevice: make(map[string]*outbox), shares: make(map[string]*share), maxCost: maxCost}
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
		if b := q.byDevice[device]; b != nil {
			d.Full = len(b.items)
			for len(b.items) > 0 {
				q.dropLocked(b.items[0])
			}
		}
		return d, nil
	case lim.MaxBytes > 0 && len(item) > lim.MaxBytes:
		d.Bytes = 1
		return d, nil
	case lim.MaxStoreBytes > 0 && int64(len(item)) > lim.MaxStoreBytes,
		q.maxCost > 0 && itemCost(item) > q.maxCost:
		d.Store = 1
		return d, nil
	case lim.MaxShareBytes > 0 && int64(len(item)) > lim.MaxShareBytes:
		d.Share = 1
		return d, nil
	}
	q.seq++
	it := &outboxItem{expiry: expiry{at: now.Add(lim.TTL)}, seq: q.seq, data: item}
	q.addLocked(device, lim.Share, it)
	b := it.box
	for len(b.items) > lim.MaxItems {
		q.dropLocked(b.items[0])
		d.Full++
	}
	for lim.MaxBytes > 0 && b.bytes > lim.MaxBytes {
		q.dropLocked(b.items[0])
		d.Bytes++
	}
	// The share's own bound, before the store's: its own oldest go.
	for sh := it.held.share; lim.MaxShareBytes > 0 && sh.bytes > lim.MaxShareBytes; {
		q.dropLocked(sh.devices[0].first)
		d.Share++
	}
	for (lim.MaxStoreBytes > 0 && q.bytes > lim.MaxStoreBytes) || (q.maxCost > 0 && q.cost > q.maxCost) {
		q.dropLocked(q.largestOldest())
		d.Store++
	}
	return d, nil
}

// addLocked queues it at the end of device's outbox, charged to device
// within share.
func (q *outboxes) addLocked(device, shareName string, it *outboxItem) {
	b := q.byDevice[device]
	if b == nil {
		b = &outbox{device: strings.Clone(device)} // not a part of a larger buffer kept alive
		q.byDevice[device] = b
		q.cost += deviceCost(device)
	}
	sh := q.shares[shareName]
	if sh == nil {
		sh = &share{name: shareName, byDevice: make(map[string]*holding)}
		q.shares[shareName] = sh
		heap.Push(&q.largest, sh)
		q.cost += shareCost(shareName)
	}
	h := sh.byDevice[device]
	if h == nil {
		h = &holding{device: b.device, share: sh}
		sh.byDevice[device] = h
		heap.Push(&sh.devices, h)
		q.cost += holdingCost
	}
	it.box, it.held = b, h
	b.items = append(b.items, it)
	if h.last == nil {
		h.first = it
	} else {
		h.last.next, it.prev = it, h.last
	}
	h.last = it
	n := len(it.data)
	b.bytes += n
	q.weigh(h, int64(n))
	q.bytes += int64(n)
	q.cost += itemCost(it.data)
	q.byDeadline.add(it)
}

// weigh adds n bytes to h and its share and restores the orders.
func (q *outboxes) weigh(h *holding, n int64) {
	h.bytes += n
	heap.Fix(&h.share.devices, h.index)
	h.share.bytes += n
	heap.Fix(&q.largest, h.share.index)
}

// largestOldest is the item the store-wide bounds drop next: the oldest
// item of the device that holds the most within the share that holds the
// most. There must be one.
func (q *outboxes) largestOldest() *outboxItem {
	return q.largest[0].devices[0].first
}

// dropLocked removes it from everything that holds it, and each holder it
// leaves empty.
func (q *outboxes) dropLocked(it *outboxItem) {
	q.byDeadline.remove(it)
	b, h := it.box, it.held
	i := sort.Search(len(b.items), func(i int) bool { return b.items[i].seq >= it.seq })
	copy(b.items[i:], b.items[i+1:])
	b.items[len(b.items)-1] = nil
	b.items = b.items[:len(b.items)-1]
	n := len(it.data)
	b.bytes -= n
	q.bytes -= int64(n)
	q.cost -= itemCost(it.data)
	if len(b.items) == 0 {
		delete(q.byDevice, b.device)
		q.cost -= deviceCost(b.device)
	}
	if it.prev == nil {
		h.first = it.next
	} else {
		it.prev.next = it.next
	}
	if it.next == nil {
		h.last = it.prev
	} else {
		it.next.prev = it.prev
	}
	it.prev, it.next = nil, nil
	q.weigh(h, -int64(n))
	sh := h.share
	if h.first == nil {
		heap.Remove(&sh.devices, h.index)
		delete(sh.byDevice, h.device)
		q.cost -= holdingCost
	}
	if len(sh.byDevice) == 0 {
		heap.Remove(&q.largest, sh.index)
		delete(q.shares, sh.name)
		q.cost -= shareCost(sh.name)
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
	for b := q.byDevice[device]; b != nil && len(b.items) > 0 && b.items[0].seq <= upTo; {
		q.dropLocked(b.items[0])
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
		q.dropLocked(it)
		n++
	}
}

// len reports the devices with an outbox.
func (q *outboxes) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.byDevice)
}

// weighted is a holder in a byWeight heap.
type weighted interface {
	weight() int64
	slot() *int // its index in the heap
}

// byWeight is a max-heap of holders by the bytes they hold
// (heap.Interface); each holder records its index, so a change of weight
// is fixed in O(log n).
type byWeight[E weighted] []E

func (h byWeight[E]) Len() int           { return len(h) }
func (h byWeight[E]) Less(i, j int) bool { return h[i].weight() > h[j].weight() }

func (h byWeight[E]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	*h[i].slot() = i
	*h[j].slot() = j
}

func (h *byWeight[E]) Push(x any) {
	e := x.(E)
	*e.slot() = len(*h)
	*h = append(*h, e)
}

func (h *byWeight[E]) Pop() any {
	old := *h
	n := len(old) - 1
	e := old[n]
	var zero E
	old[n] = zero
	*h = old[:n]
	*e.slot() = -1
	return e
}
