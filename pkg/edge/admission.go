package edge

import (
	"container/heap"
	"net/netip"
	"time"
)

// The hello phase, and admission to it that is fair by construction.
//
// A socket is in the hello phase from its upgrade until its hello is
// answered (ready or an error). The phase holds at most helloCap sockets:
// each holds at most a pooled reader and a message of MaxPreHelloBytes
// (helloSocketBytes), so what the phase holds is bounded by the count,
// decided once, at the upgrade, before a socket costs anything.
//
// Within the phase, a socket whose hello has not been read and accepted
// yet is a stranger. Strangers are counted by source (an IPv4 address, an
// IPv6 /64: Config.HelloPrefixV4, HelloPrefixV6), at most perSource of one
// source. A socket whose hello carried a valid token is no stranger: it
// stays in the phase, uncounted by source and never pushed out, until its
// hello is answered.
//
// When there is no room for a newcomer, a stranger may go instead, and the
// newcomer is admitted:
//   - the phase is full and some source holds at least two strangers more
//     than the newcomer's: that source's oldest stranger goes (max-min
//     fairness: an attacker holding many sockets loses them to anyone
//     holding fewer);
//   - otherwise the oldest stranger of the phase, or of the newcomer's
//     source when that is at its cap, goes if it has waited helloGrace
//     (a phone's hello comes one round trip after its upgrade).
//
// Only when none can go is the newcomer refused, with HTTP 503 and a
// Retry-After that spreads the refused over what the edge answers a
// second (retryAfter): a crowd coming back after an edge died is shed,
// cheaply, instead of collapsing the edge, and converges.

// helloSocketBytes is the most a socket in the hello phase holds of
// messages: the pooled reader and a message at its bound.
const helloSocketBytes = readerSize + MaxPreHelloBytes

// Bounds of the Retry-After of a refused upgrade, in seconds.
const (
	minRetryAfter = 1
	maxRetryAfter = 60
)

// helloEntry is one socket in the hello phase. While a stranger, it is in
// its source's list and in the phase's list, oldest first.
type helloEntry struct {
	c     *conn
	src   *helloSource  // nil once the hello was accepted
	since time.Duration // the upgrade, since Server.start
	by    time.Duration // the hello must have come by (HelloTimeout)
	// The lists of strangers: of the source, and of the phase.
	prev, next   *helloEntry
	gprev, gnext *helloEntry
}

// helloSource is the strangers of one source.
type helloSource struct {
	key         netip.Prefix
	n           int // strangers, upgrades under way included
	first, last *helloEntry
	idx         int // in helloPhase.bySize
}

// helloPhase is the state of the phase, under Server.mu.
type helloPhase struct {
	cap       int           // sockets in the phase
	perSource int           // strangers of one source
	grace     time.Duration // a stranger that waited this long may go for a newcomer
	prefix4   int           // bits of an IPv4 address that name a source
	prefix6   int           // bits of an IPv6 address that name a source

	n                int // sockets in the phase, upgrades under way included
	strangers        int
	entries          map[*conn]*helloEntry
	sources          map[netip.Prefix]*helloSource
	bySize           sourceHeap // sources by strangers held, the most first
	gfirst, glast    *helloEntry
	window           time.Duration // start of the current second
	served, shed     int           // hellos answered, upgrades refused, in this second
	lastServed, last int           // the same, in the second before (last: shed)
}

func newHelloPhase(cfg Config) *helloPhase {
	return &helloPhase{
		cap:       min(cfg.MaxHelloConns, int(cfg.MaxHelloBytes/helloSocketBytes)),
		perSource: cfg.MaxHelloConnsPerAddr,
		grace:     cfg.HelloTimeout / 8,
		prefix4:   cfg.HelloPrefixV4,
		prefix6:   cfg.HelloPrefixV6,
		entries:   make(map[*conn]*helloEntry),
		sources:   make(map[netip.Prefix]*helloSource),
	}
}

// sourceOf is the source client's strangers count against. An unknown
// client (the zero Addr: no usable forwarding header from a trusted proxy)
// is one source of its own.
func (p *helloPhase) sourceOf(client netip.Addr) netip.Prefix {
	if !client.IsValid() {
		return netip.Prefix{}
	}
	client = client.Unmap()
	bits := p.prefix6
	if client.Is4() {
		bits = p.prefix4
	}
	pfx, err := client.Prefix(bits)
	if err != nil {
		return netip.PrefixFrom(client, client.BitLen())
	}
	return pfx
}

// admit takes a place in the phase for a stranger from client. When there
// is no room, victim is the stranger that gives up its place; when none
// can, ok is false. The place is the newcomer's at once: enter or cancel
// it, and close the victim (evict), outside Server.mu.
func (p *helloPhase) admit(client netip.Addr, now time.Duration) (src netip.Prefix, victim *conn, ok bool) {
	src = p.sourceOf(client)
	s := p.sources[src]
	own := 0
	if s != nil {
		own = s.n
	}
	var v *helloEntry
	switch {
	case own >= p.perSource:
		v = p.stale(s.first, now)
	case p.n >= p.cap:
		if top := p.largest(); top != nil && top.n >= own+2 && top.first != nil {
			v = top.first
		} else {
			v = p.stale(p.gfirst, now)
		}
	}
	if (own >= p.perSource || p.n >= p.cap) && v == nil {
		p.tick(now)
		p.shed++
		return src, nil, false
	}
	if v != nil {
		victim = v.c
		p.leave(v.c, false)
		s = p.sources[src] // the victim may have been its last stranger
	}
	if s == nil {
		s = &helloSource{key: src}
		p.sources[src] = s
		heap.Push(&p.bySize, s)
	}
	s.n++
	heap.Fix(&p.bySize, s.idx)
	p.n++
	p.strangers++
	return src, victim, true
}

// largest is the source holding the most strangers, or nil.
func (p *helloPhase) largest() *helloSource {
	if len(p.bySize) == 0 {
		return nil
	}
	return p.bySize[0]
}

// stale is e if it is a stranger that has waited helloGrace, else nil.
func (p *helloPhase) stale(e *helloEntry, now time.Duration) *helloEntry {
	if e != nil && now-e.since >= p.grace {
		return e
	}
	return nil
}

// enter makes c, upgraded, the holder of the place admit took for src.
func (p *helloPhase) enter(c *conn, src netip.Prefix, now, timeout time.Duration) {
	s := p.sources[src]
	e := &helloEntry{c: c, src: s, since: now, by: now + timeout}
	p.entries[c] = e
	e.prev = s.last
	if s.last != nil {
		s.last.next = e
	} else {
		s.first = e
	}
	s.last = e
	e.gprev = p.glast
	if p.glast != nil {
		p.glast.gnext = e
	} else {
		p.gfirst = e
	}
	p.glast = e
}

// cancel gives back a place admit took for src that no socket entered.
func (p *helloPhase) cancel(src netip.Prefix) {
	p.n--
	p.strangers--
	p.dropStranger(p.sources[src])
}

// accepted: c's hello carried a valid token. It is no stranger any more,
// but stays in the phase until its hello is answered (leave).
func (p *helloPhase) accepted(c *conn) {
	if e := p.entries[c]; e != nil && e.src != nil {
		p.unlink(e)
	}
}

// leave takes c out of the phase, once; answered counts it among the
// hellos answered (for Retry-After).
func (p *helloPhase) leave(c *conn, answered bool) {
	e := p.entries[c]
	if e == nil {
		return
	}
	delete(p.entries, c)
	if e.src != nil {
		p.unlink(e)
	}
	p.n--
	if answered {
		p.served++
	}
}

// unlink takes the stranger e off its source and the phase's list.
func (p *helloPhase) unlink(e *helloEntry) {
	s := e.src
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		s.first = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		s.last = e.prev
	}
	if e.gprev != nil {
		e.gprev.gnext = e.gnext
	} else {
		p.gfirst = e.gnext
	}
	if e.gnext != nil {
		e.gnext.gprev = e.gprev
	} else {
		p.glast = e.gprev
	}
	e.src, e.prev, e.next, e.gprev, e.gnext = nil, nil, nil, nil, nil
	p.strangers--
	p.dropStranger(s)
}

// dropStranger counts one stranger fewer for s.
func (p *helloPhase) dropStranger(s *helloSource) {
	s.n--
	if s.n == 0 {
		heap.Remove(&p.bySize, s.idx)
		delete(p.sources, s.key)
		return
	}
	heap.Fix(&p.bySize, s.idx)
}

// late appends the strangers whose hello is overdue at now, and takes them
// out of the phase.
func (p *helloPhase) late(now time.Duration, dst []*conn) []*conn {
	for e := p.gfirst; e != nil; {
		next := e.gnext
		if now >= e.by {
			dst = append(dst, e.c)
			p.leave(e.c, false)
		}
		e = next
	}
	return dst
}

// tick starts a new second of the Retry-After counts when now is past it.
func (p *helloPhase) tick(now time.Duration) {
	switch {
	case now-p.window >= 2*time.Second:
		p.lastServed, p.last, p.served, p.shed = 0, 0, 0, 0
		p.window = now
	case now-p.window >= time.Second:
		p.lastServed, p.last, p.served, p.shed = p.served, p.shed, 0, 0
		p.window += time.Second
	}
}

// retryAfter is the Retry-After of a refused upgrade, in seconds: the
// upgrades refused in the last second, spread over what the edge answered
// in it, so that they come back at the pace they are served.
func (p *helloPhase) retryAfter(now time.Duration) int {
	p.tick(now)
	refused := p.last + p.shed
	served := max(p.lastServed, p.served, 1)
	return min(max((refused+served-1)/served, minRetryAfter), maxRetryAfter)
}

// sourceHeap orders sources by the strangers they hold, the most first.
type sourceHeap []*helloSource

func (h sourceHeap) Len() int           { return len(h) }
func (h sourceHeap) Less(i, j int) bool { return h[i].n > h[j].n }
func (h sourceHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *sourceHeap) Push(x any) {
	s := x.(*helloSource)
	s.idx = len(*h)
	*h = append(*h, s)
}
func (h *sourceHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return s
}
