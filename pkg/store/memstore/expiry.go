package memstore

import (
	"container/heap"
	"time"
)

// expiry is embedded in every entry that expires: its deadline and its place
// in an expiryQueue.
type expiry struct {
	at    time.Time // the entry is gone once now is not before at
	index int       // position in the queue; -1 when not queued
}

func (e *expiry) exp() *expiry { return e }

// expiring is an entry that embeds expiry.
type expiring interface{ exp() *expiry }

// expired reports whether a deadline at has passed at now.
func expired(at, now time.Time) bool { return !at.After(now) }

// expiryQueue is a min-heap of entries by deadline. Entries record their
// index, so add, remove and fix cost O(log n) and the earliest deadline is
// found in O(1). The zero value is an empty queue.
type expiryQueue[E expiring] struct{ h entryHeap[E] }

func (q *expiryQueue[E]) add(e E) { heap.Push(&q.h, e) }

// remove takes e out of the queue if it is queued.
func (q *expiryQueue[E]) remove(e E) {
	if i := e.exp().index; i >= 0 {
		heap.Remove(&q.h, i)
	}
}

// fix restores the order after e's deadline changed.
func (q *expiryQueue[E]) fix(e E) { heap.Fix(&q.h, e.exp().index) }

// popExpired removes and returns the entry with the earliest deadline if that
// deadline has passed at now.
func (q *expiryQueue[E]) popExpired(now time.Time) (E, bool) {
	if len(q.h) == 0 || !expired(q.h[0].exp().at, now) {
		var zero E
		return zero, false
	}
	return heap.Pop(&q.h).(E), true
}

// entryHeap implements heap.Interface for expiryQueue.
type entryHeap[E expiring] []E

func (h entryHeap[E]) Len() int           { return len(h) }
func (h entryHeap[E]) Less(i, j int) bool { return h[i].exp().at.Before(h[j].exp().at) }

func (h entryHeap[E]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].exp().index = i
	h[j].exp().index = j
}

func (h *entryHeap[E]) Push(x any) {
	e := x.(E)
	e.exp().index = len(*h)
	*h = append(*h, e)
}

func (h *entryHeap[E]) Pop() any {
	old := *h
	n := len(old) - 1
	e := old[n]
	var zero E
	old[n] = zero
	*h = old[:n]
	e.exp().index = -1
	return e
}
