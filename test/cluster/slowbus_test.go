//go:build unix

package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// An edge far from NATS: what it sends reaches the NATS server late. These
// tests make deterministic what otherwise happens now and then (a busy edge,
// a slow network): the edge's interest in a device reaches NATS after the
// phone got ready.

// busDelay is how late the slow edge's bytes reach NATS.
const busDelay = 300 * time.Millisecond

// TestDeliverRightAfterReady: once a phone has its ready, it is online, so a
// deliver must reach it and what the agent says must be written to it, not
// kept in the outbox until some later reconnection. The edge here is slow
// to reach NATS (busDelay).
func TestDeliverRightAfterReady(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	c.startEdge(t, "S", "NATS_URL="+slowLink(t, strings.TrimPrefix(c.nats, "nats://"), busDelay).url())

	dev := newDevice("tel")
	conn := c.hello(t, "S", dev)
	code, body := c.deliver(t, dev, "d-1", "right after ready")
	if code != http.StatusOK {
		t.Errorf("deliver right after ready: %d %v, want 200: the edge sent ready before NATS knew it holds %s", code, body, dev)
	}
	c.say(t, dev, agentMessage{ID: "a-1", Text: "the agent, right after ready", Final: true})
	c.waitReachable(t, dev)
	c.mustDeliver(t, dev, "marker", "marker")
	fs := readUntil(t, conn, "the marker", finalText("marker"))
	got := texts(messages(fs))
	want := []string{"the agent, right after ready", "marker"}
	if code == http.StatusOK {
		want = append([]string{"right after ready"}, want...)
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the phone got %q, want %q (the agent's message went to the outbox of an online device)", got, want)
	}
}

// TestTakeoverSlowBus (b): the device says hello on the slow edge S, then,
// while S's interest in it is still on its way to NATS, on edge A. The socket
// on S must still be closed 1000 within 1 s, as in any takeover.
func TestTakeoverSlowBus(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	c.startEdge(t, "S", "NATS_URL="+slowLink(t, strings.TrimPrefix(c.nats, "nats://"), busDelay).url())

	dev := newDevice("tel")
	slow := c.hello(t, "S", dev)
	start := time.Now()
	fresh := c.connect(t, "A", dev)
	fs, ci := readUntilClose(t, slow, 3*time.Second)
	switch {
	case ci == nil:
		t.Errorf("the older socket on S is still open 3 s after the hello on A (S missed the takeover):%s", describe(fs))
	case ci.Code != 1000:
		t.Errorf("the older socket on S was closed with %s, want 1000", ci)
	case time.Since(start) > takeoverWithin:
		t.Errorf("the older socket on S was closed %v after the hello on A, want within %v", time.Since(start), takeoverWithin)
	}
	c.mustDeliver(t, dev, "d-1", "to the new socket")
	readUntil(t, fresh, "the delivery", finalText("to the new socket"))
}

// TestOutputRacingTakeover: the agent speaks to a device just as it moves
// from edge A to edge B. The router has read the owner (A, at the old
// epoch) and its request is on the way (the router's link to NATS is slow)
// when the device says hello on B. The message must still reach the device:
// on its socket on B, promptly, since the device is online there.
func TestOutputRacingTakeover(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{routerBusDelay: busDelay})
	dev := newDevice("tel")
	old := c.connect(t, "A", dev)

	type answer struct {
		code int
		body map[string]any
		err  error
		took time.Duration
	}
	answered := make(chan answer, 1)
	inFlight := c.routerLink.watch("said as the device moved")
	ctx := testCtx(t)
	start := time.Now()
	go func() {
		var a answer
		a.code, a.body, a.err = c.tryPost(ctx, "/v1/sessions/"+protocol.Session(dev)+"/messages", c.agentToken,
			agentMessage{ID: "a-1", Text: "said as the device moved", Final: true})
		a.took = time.Since(start)
		answered <- a
	}()
	select {
	case <-inFlight: // the router read the owner and sent its request
	case <-time.After(10 * time.Second):
		t.Fatal("the router's delivery request never left it")
	}
	fresh := c.hello(t, "B", dev)
	expectClose(t, old, takeoverWithin, 1000)

	const wait = 5 * time.Second
	ctxMsg, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var got []client.Frame
	for {
		f, err := fresh.Next(ctxMsg)
		if err != nil {
			state := "had not answered"
			select {
			case a := <-answered:
				state = fmt.Sprintf("answered %d %v (%v) after %v", a.code, a.body, a.err, a.took)
			default:
			}
			t.Fatalf("the agent's message, sent as the device moved from A to B, did not reach the socket on B within %v "+
				"(the router's POST %s); B got:%s", wait, state, describe(got))
		}
		got = append(got, f)
		if finalText("said as the device moved")(f) {
			break
		}
	}
	if ms := messages(got); len(ms) != 1 || ms[0].frames != 1 {
		t.Errorf("B got %+v, want the message once", ms)
	}
}

// link is a TCP proxy to a target on a loopback port: bytes from its
// clients reach the target delay late (in order); bytes back pass at once.
type link struct {
	addr  string
	delay time.Duration

	mu      sync.Mutex
	conns   []net.Conn // nil once closed
	watches []linkWatch
}

type linkWatch struct {
	pattern []byte
	seen    chan struct{}
}

// slowLink starts a link to target; it closes when the test ends.
func slowLink(t *testing.T, target string, delay time.Duration) *link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{addr: ln.Addr().String(), delay: delay, conns: []net.Conn{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		l.mu.Lock()
		for _, c := range l.conns {
			c.Close()
		}
		l.conns = nil
		l.mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				down.Close()
				continue
			}
			if !l.track(down, up) {
				down.Close()
				up.Close()
				return
			}
			wg.Go(func() { io.Copy(down, up); down.Close() })
			wg.Go(func() { l.delayCopy(up, down); up.Close() })
		}
	})
	return l
}

// url is the link's address as a NATS URL.
func (l *link) url() string { return "nats://" + l.addr }

func (l *link) track(cs ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns == nil {
		return false
	}
	l.conns = append(l.conns, cs...)
	return true
}

// watch returns a channel closed once a client sends bytes containing
// pattern (within one read), from now on.
func (l *link) watch(pattern string) <-chan struct{} {
	w := linkWatch{[]byte(pattern), make(chan struct{})}
	l.mu.Lock()
	l.watches = append(l.watches, w)
	l.mu.Unlock()
	return w.seen
}

func (l *link) inspect(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.watches[:0]
	for _, w := range l.watches {
		if bytes.Contains(b, w.pattern) {
			close(w.seen)
			continue
		}
		kept = append(kept, w)
	}
	l.watches = kept
}

// delayCopy copies src to dst, each chunk l.delay after it was read,
// until src ends.
func (l *link) delayCopy(dst io.Writer, src io.Reader) {
	type chunk struct {
		at time.Time
		b  []byte
	}
	ch := make(chan chunk, 1024)
	go func() {
		defer close(ch)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				l.inspect(b[:n])
				ch <- chunk{time.Now(), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	failed := false
	for c := range ch {
		if failed {
			continue // drop the rest, so the reader is never stuck
		}
		time.Sleep(time.Until(c.at.Add(l.delay))) // the link's latency under test
		_, err := dst.Write(c.b)
		failed = err != nil
	}
}
