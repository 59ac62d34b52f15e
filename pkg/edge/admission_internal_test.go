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
// source holding fewer takes the place of the oldest stranger of the
// source holding the most, however young; a newcomer of that source
// itself does not.
func TestHelloPhaseLargestHolderGoes(t *testing.T) {
	p := phaseFor(6, 256)
	var attacker []*conn
	for i := range 5 {
		c, _ := arrive(t, p, "198.51.100.7", time.Duration(i))
		attacker = append(attacker, c)
	}
	arrive(t, p, "192.0.2.1", 5)
	checkCounts(t, p, 6, 6)
	if c, v := arrive(t, p, "198.51.100.7", 6); c != nil || v != nil {
		t.Fatalf("a newcomer of the largest source: admitted %v, victim %v", c != nil, v)
	}
	c, v := arrive(t, p, "203.0.113.1", 7)
	if c == nil || v != attacker[0] {
		t.Fatalf("a newcomer of a small source: admitted %v, victim is the largest source's oldest %v", c != nil, v == attacker[0])
	}
	// Sources of 1 (192.0.2.1) and 4 (the attacker): a newcomer of the
	// first source (2 after it) still takes the attacker's (4 ≥ 1+2).
	c, v = arrive(t, p, "192.0.2.1", 8)
	if c == nil || v != attacker[1] {
		t.Fatalf("a newcomer of a source holding 1 against 4: admitted %v, victim %v", c != nil, v == attacker[1])
	}
	checkCounts(t, p, 6, 6)
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
	p.leave(a, true)
	p.leave(a, true) // once
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

// TestRetryAfter spreads the refused of the last second over what was
// answered in it, between 1 and 60 s.
func TestRetryAfter(t *testing.T) {
	p := phaseFor(10, 256)
	if got := p.retryAfter(0); got != minRetryAfter {
		t.Fatalf("idle: Retry-After %d", got)
	}
	p.served, p.shed = 1000, 2500
	if got := p.retryAfter(500 * time.Millisecond); got != 3 {
		t.Fatalf("2,500 refused, 1,000 answered: Retry-After %d, want 3", got)
	}
	if got := p.retryAfter(1500 * time.Millisecond); got != 3 {
		t.Fatalf("the second after: Retry-After %d, want 3 (the last second counts)", got)
	}
	p.shed = 1_000_000
	if got := p.retryAfter(1600 * time.Millisecond); got != maxRetryAfter {
		t.Fatalf("Retry-After %d, want the cap %d", got, maxRetryAfter)
	}
	if got := p.retryAfter(10 * time.Second); got != minRetryAfter {
		t.Fatalf("after a quiet while: Retry-After %d", got)
	}
}
