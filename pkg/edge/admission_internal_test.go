package edge

import (
	"net/netip"
	"testing"
	"time"
)

// phaseFor is a hello phase of cap sockets, perSource strangers a source,
// the default grace (HelloTimeout/8) and prefixes.
func phaseFor(cap, perSource int) *helloPhase {
	cfg := Config{MaxHelloConns: cap, MaxHelloBytes: int64(cap) * helloSocketBytes, MaxHelloConnsPerAddr: perSource}
	cfg.setDefaults()
	return newHelloPhase(cfg)
}

// arrive admits and enters a socket from addr at now; it reports the socket
// (nil when refused) and the victim.
func arrive(t *testing.T, p *helloPhase, addr string, now time.Duration) (c, victim *conn) {
	t.Helper()
	src, victim, ok := p.admit(netip.MustParseAddr(addr), now)
	if !ok {
		return nil, victim
	}
	c = &conn{}
	p.enter(c, src, now, 15*time.Second)
	return c, victim
}

func checkCounts(t *testing.T, p *helloPhase, n, strangers int) {
	t.Helper()
	if p.n != n || p.strangers != strangers || len(p.entries) != n {
		t.Fatalf("phase holds n=%d strangers=%d entries=%d, want %d, %d, %d", p.n, p.strangers, len(p.entries), n, strangers, n)
	}
	sum := 0
	for _, s := range p.sources {
		sum += s.n
	}
	if sum != strangers {
		t.Fatalf("sources count %d strangers, want %d", sum, strangers)
	}
}

// TestHelloPhaseCapBoundary: exactly cap sockets are admitted with nobody
// pushed out; the next, from a source no larger than the others, is
// refused until the oldest stranger has waited the grace, and then takes
// exactly that one's place.
func TestHelloPhaseCapBoundary(t *testing.T) {
	p := phaseFor(4, 256)
	var first *conn
	for i := range 4 {
		c, v := arrive(t, p, "192.0.2."+string(rune('1'+i)), time.Duration(i)*time.Millisecond)
		if c == nil || v != nil {
			t.Fatalf("socket %d of the cap: admitted %v, victim %v", i+1, c != nil, v)
		}
		if i == 0 {
			first = c
		}
	}
	checkCounts(t, p, 4, 4)
	if c, v := arrive(t, p, "192.0.2.9", p.grace-time.Millisecond); c != nil || v != nil {
		t.Fatalf("cap+1 before any stranger waited the grace: admitted %v, victim %v", c != nil, v)
	}
	c, v := arrive(t, p, "192.0.2.9", p.grace)
	if c == nil || v != first {
		t.Fatalf("cap+1 once the oldest waited the grace: admitted %v, victim is the oldest %v", c != nil, v == first)
	}
	checkCounts(t, p, 4, 4)
}

// TestHelloPhaseLargestHolderGoes: with the phase full, a newcomer from a
// source holding own strangers takes the place of the oldest stranger of
// a source holding k ≥ own+2 once that one has waited the grace ×
// (own+1)/k, not before (a phone of a crowd whose hello is on its way
// keeps its place); a newcomer of that source itself does not.
func TestHelloPhaseLargestHolderGoes(t *testing.T) {
	p := phaseFor(6, 256)
	var attacker []*conn
	for i := range 5 {
		c, _ := arrive(t, p, "198.51.100.7", time.Duration(i))
		attacker = append(attacker, c)
	}
	arrive(t, p, "192.0.2.1", 5)
	checkCounts(t, p, 6, 6)
	// A newcomer of a new source (own 0) against 5: a fifth of the grace.
	fifth := p.grace / 5
	if c, v := arrive(t, p, "203.0.113.1", fifth-1); c != nil || v != nil {
		t.Fatalf("a newcomer of a new source before the largest's oldest waited a fifth of the grace: admitted %v, victim %v", c != nil, v)
	}
	if c, v := arrive(t, p, "198.51.100.7", p.grace-1); c != nil || v != nil {
		t.Fatalf("a newcomer of the largest source: admitted %v, victim %v", c != nil, v)
	}
	c, v := arrive(t, p, "203.0.113.1", fifth)
	if c == nil || v != attacker[0] {
		t.Fatalf("a newcomer of a new source at a fifth of the grace: admitted %v, victim is the largest source's oldest %v", c != nil, v == attacker[0])
	}
	// Sources of 1 (192.0.2.1) and 4 (the attacker): a newcomer of the
	// first source (2 after it) takes the attacker's second once it waited
	// (1+1)/4 of the grace, not before.
	half := p.grace / 2
	if c, v := arrive(t, p, "192.0.2.1", 1+half-1); c != nil || v != nil {
		t.Fatalf("a newcomer of a source holding 1 against 4 before half the grace: admitted %v, victim %v", c != nil, v)
	}
	c, v = arrive(t, p, "192.0.2.1", 1+half)
	if c == nil || v != attacker[1] {
		t.Fatalf("a newcomer of a source holding 1 against 4 at half the grace: admitted %v, victim %v", c != nil, v == attacker[1])
	}
	checkCounts(t, p, 6, 6)
}

// TestHelloPhaseYoungLargestKeepsItsPlace: when the largest source's
// oldest stranger has not waited its share of the grace, the oldest of the
// phase goes if it waited the grace, whatever its source.
func TestHelloPhaseYoungLargestKeepsItsPlace(t *testing.T) {
	p := phaseFor(4, 256)
	stalled, _ := arrive(t, p, "192.0.2.1", 0)
	for range 3 {
		arrive(t, p, "198.51.100.7", p.grace-1)
	}
	c, v := arrive(t, p, "203.0.113.1", p.grace)
	if c == nil || v != stalled {
		t.Fatalf("admitted %v, victim is the stranger that waited the grace %v", c != nil, v == stalled)
	}
	checkCounts(t, p, 4, 4)
}

// TestHelloPhasePerSource: a source at its cap is refused, also with room
// in the phase, until its own oldest waited the grace; another source is
// admitted meanwhile. IPv6 addresses of one /64 are one source.
func TestHelloPhasePerSource(t *testing.T) {
	p := phaseFor(100, 3)
	var own []*conn
	for i, a := range []string{"2001:db8::1", "2001:db8::ffff:1", "2001:db8::abcd"} {
		c, _ := arrive(t, p, a, time.Duration(i))
		if c == nil {
			t.Fatalf("stranger %d of one /64 refused", i+1)
		}
		own = append(own, c)
	}
	if c, _ := arrive(t, p, "2001:db8::2", 3); c != nil {
		t.Fatal("a 4th stranger of one /64 admitted past the per-source cap of 3")
	}
	if c, _ := arrive(t, p, "2001:db8:0:1::1", 3); c == nil {
		t.Fatal("a stranger of the next /64 refused")
	}
	c, v := arrive(t, p, "2001:db8::2", p.grace)
	if c == nil || v != own[0] {
		t.Fatalf("the /64's newcomer once its oldest waited the grace: admitted %v, victim %v", c != nil, v == own[0])
	}
	checkCounts(t, p, 4, 4)

	q := phaseFor(100, 1)
	q.prefix4 = 24
	arrive(t, q, "192.0.2.1", 0)
	if c, _ := arrive(t, q, "192.0.2.200", 0); c != nil {
		t.Fatal("with IPv4 sources of /24, a second stranger of 192.0.2.0/24 admitted past the cap of 1")
	}
	if c, _ := arrive(t, q, "::ffff:192.0.3.1", 0); c == nil {
		t.Fatal("an IPv4-mapped address of another /24 refused")
	}
}

// TestHelloPhaseAcceptedStay: a socket whose hello was accepted is never
// pushed out nor timed out; it leaves once answered, and only then is
// there room.
func TestHelloPhaseAcceptedStay(t *testing.T) {
	p := phaseFor(2, 256)
	a, _ := arrive(t, p, "192.0.2.1", 0)
	b, _ := arrive(t, p, "192.0.2.1", 0)
	p.accepted(a)
	p.accepted(b)
	checkCounts(t, p, 2, 0)
	if c, v := arrive(t, p, "192.0.2.2", time.Hour); c != nil || v != nil {
		t.Fatalf("with the phase full of accepted hellos: admitted %v, victim %v", c != nil, v)
	}
	if late := p.late(time.Hour, nil); len(late) != 0 {
		t.Fatalf("%d accepted hellos timed out", len(late))
	}
	p.leave(a, time.Hour)
	p.leave(a, time.Hour) // once
	checkCounts(t, p, 1, 0)
	if c, _ := arrive(t, p, "192.0.2.2", time.Hour); c == nil {
		t.Fatal("refused with room after an answered hello left")
	}
	src, _, ok := p.admit(netip.MustParseAddr("192.0.2.3"), time.Hour)
	if ok {
		p.cancel(src)
		t.Fatal("admitted past the cap")
	}
	if late := p.late(time.Hour+15*time.Second, nil); len(late) != 1 {
		t.Fatalf("%d strangers overdue, want the one", len(late))
	}
	checkCounts(t, p, 1, 0)
}

// TestRetryAfter hands the refused return times at the pace the phase
// freed places in the last second (at least its cap over the hello
// timeout), between 1 and 60 s.
func TestRetryAfter(t *testing.T) {
	p := phaseFor(1500, 256) // the floor: 1,500 places over 15 s, 100 a second
	if p.floorRate != 100 {
		t.Fatalf("floor %d places a second, want 100", p.floorRate)
	}
	if got := p.retryAfter(0); got != minRetryAfter {
		t.Fatalf("idle: Retry-After %d", got)
	}
	// 1,000 places freed in the second that starts at 10 s: the refused
	// of 10.5 s come back 1,000 a second.
	now := 10 * time.Second
	p.tick(now)
	p.freed = 1000
	now += 500 * time.Millisecond
	for i := 1; i <= 2500; i++ {
		want := (i + 999) / 1000
		if got := p.retryAfter(now); got != want {
			t.Fatalf("refused %d with 1,000 places freed a second: Retry-After %d, want %d", i, got, want)
		}
	}
	// A second without places freed: the floor, 100 a second, from where
	// the times handed out end (2.5 s ahead of 10.5 s, 1.5 s of 11.5 s).
	now += time.Second
	p.freed = 0
	if got := p.retryAfter(now); got != 2 {
		t.Fatalf("the second after: Retry-After %d, want 2 (the last second's pace)", got)
	}
	now += 2 * time.Second // 13.5 s: two seconds with nothing freed
	for i := 1; i <= 100; i++ {
		if got := p.retryAfter(now); got != 1 {
			t.Fatalf("refused %d at the floor of 100 a second: Retry-After %d, want 1", i, got)
		}
	}
	if got := p.retryAfter(now); got != 2 {
		t.Fatalf("refused 101 at the floor of 100 a second: Retry-After %d, want 2", got)
	}
	for range 10_000 {
		p.retryAfter(now)
	}
	if got := p.retryAfter(now); got != maxRetryAfter {
		t.Fatalf("Retry-After %d, want the cap %d", got, maxRetryAfter)
	}
	if p.returns > now+maxRetryAfter*time.Second {
		t.Fatalf("return times handed out %v ahead, past the cap", p.returns-now)
	}
	if got := p.retryAfter(now + 2*time.Minute); got != minRetryAfter {
		t.Fatalf("after a quiet while: Retry-After %d", got)
	}
}
