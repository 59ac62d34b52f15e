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
// When there is no room for a newcomer, a stranger that has waited may go
// instead, and the newcomer is admitted:
//   - the phase is full and some source holds k strangers, at least two
//     more than the newcomer's source holds (own): that source's oldest
//     goes if it waited the grace × (own+1)/k (max-min fairness: a source
//     holding many sockets loses them to one holding fewer, the sooner
//     the more it holds);
//   - otherwise the oldest stranger of the phase, or of the newcomer's
//     source when that is at its cap, goes if it waited the grace
//     (HelloTimeout/8: a phone's hello comes one round trip after its
//     upgrade).
//
// The wait keeps a crowd's phones: when phones come back at once from a
// few hundred addresses, sources differ by a few strangers at every
// moment, and a phone whose hello sits unread while the edge's cores are
// busy would otherwise lose its place to one no more legitimate, the work
// done for it thrown away. An attacker holding the phase from a few
// addresses holds hundreds a source, and its sockets go within
// milliseconds. Only when none can go is the newcomer refused, with HTTP 503 and a
// Retry-After that hands the refused return times at the pace the phase
// turns its places over (retryAfter): a crowd coming back after an edge
// died is shed, cheaply, instead of collapsing the edge, and converges.

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

	n             int // sockets in the phase, upgrades under way included
	strangers     int
	entries       map[*conn]*helloEntry
	sources       map[netip.Prefix]*helloSource
	bySize        sourceHeap // sources by strangers held, the most first
	gfirst, glast *helloEntry
	// Retry-After: places freed in the current second (from window) and
	// in the one before, and the time until which return times are
	// handed out.
	window           time.Duration
	freed, lastFreed int
	floorRate        int // places freed a second at the least: cap over HelloTimeout
	returns          time.Duration
}

func newHelloPhase(cfg Config) *helloPhase {
	p := &helloPhase{
		cap:       min(cfg.MaxHelloConns, int(cfg.MaxHelloBytes/helloSocketBytes)),
		perSource: cfg.MaxHelloConnsPerAddr,
		grace:     cfg.HelloTimeout / 8,
		prefix4:   cfg.HelloPrefixV4,
		prefix6:   cfg.HelloPrefixV6,
		entries:   make(map[*conn]*helloEntry),
		sources:   make(map[netip.Prefix]*helloSource),
	}
	p.floorRate = max(1, int(float64(p.cap)/cfg.HelloTimeout.Seconds()))
	return p
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
		if top := p.largest(); top != nil && top.n >= own+2 {
			v = p.waited(top.first, now, p.grace*time.Duration(own+1)/time.Duration(top.n))
		}
		if v == nil {
			v = p.stale(p.gfirst, now)
		}
	}
	if (own >= p.perSource || p.n >= p.cap) && v == nil {
		return src, nil, false
	}
	if v != nil {
		victim = v.c
		p.leave(v.c, now)
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

// stale is e if it is a stranger that has waited the grace, else nil.
func (p *helloPhase) stale(e *helloEntry, now time.Duration) *helloEntry {
	return p.waited(e, now, p.grace)
}

// waited is e if it is a stranger that has waited d, else nil.
func (p *helloPhase) waited(e *helloEntry, now, d time.Duration) *helloEntry {
	if e != nil && now-e.since >= d {
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

// leave takes c out of the phase, once, at now.
func (p *helloPhase) leave(c *conn, now time.Duration) {
	e := p.entries[c]
	if e == nil {
		return
	}
	delete(p.entries, c)
	if e.src != nil {
		p.unlink(e)
	}
	p.n--
	p.tick(now)
	p.freed++
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
			p.leave(e.c, now)
		}
		e = next
	}
	return dst
}

// tick starts a new second of the counts of places freed when now is past
// the current one.
func (p *helloPhase) tick(now time.Duration) {
	switch {
	case now-p.window >= 2*time.Second:
		p.lastFreed, p.freed = 0, 0
		p.window = now
	case now-p.window >= time.Second:
		p.lastFreed, p.freed = p.freed, 0
		p.window += time.Second
	}
}

// retryAfter is the Retry-After of an upgrade refused at now, in seconds.
// The refused are handed return times one after the other, at the pace
// the phase frees places (the most of this second and the one before, and
// at least floorRate: every stranger leaves by the hello timeout), so that
// a crowd comes back no faster than the edge lets it in. A quiet edge
// answers 1; the times handed out run at most maxRetryAfter ahead.
func (p *helloPhase) retryAfter(now time.Duration) int {
	p.tick(now)
	rate := max(p.freed, p.lastFreed, p.floorRate)
	p.returns = min(max(p.returns, now)+time.Second/time.Duration(rate), now+maxRetryAfter*time.Second)
	secs := int((p.returns - now + time.Second - 1) / time.Second)
	return min(max(secs, minRetryAfter), maxRetryAfter)
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
