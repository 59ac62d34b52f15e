//go:build unix

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// takeoverWithin is how soon the older socket must be closed.
const takeoverWithin = time.Second

// TestTakeoverAcrossEdges (b): a device on edge A reconnects to edge B while
// its socket on A is open. The socket on A gets close 1000 within 1 s. A
// stream of deliveries runs through the move: each one answered 200 reaches
// the phone, once, or once on each socket when it raced the move; none
// begun after B's ready reaches A, and once B can be reached (see
// waitReachable) every delivery reaches B alone.
func TestTakeoverAcrossEdges(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	dev := newDevice("tel")
	old := c.connect(t, "A", dev)
	c.mustDeliver(t, dev, "before", "before the takeover")
	readUntil(t, old, "the first delivery", finalText("before the takeover"))

	type result struct {
		id    string
		code  int
		ready bool // begun after the new socket's ready
		err   error
		took  time.Duration
	}
	var (
		mu      sync.Mutex
		results []result
		ready   atomic.Bool
		stopped = make(chan struct{})
	)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(stopped)
		for i := 0; ctx.Err() == nil; i++ {
			r := result{id: fmt.Sprintf("live-%03d", i), ready: ready.Load()}
			start := time.Now()
			r.code, _, r.err = c.tryPost(ctx, "/v1/deliver", c.deliverToken, map[string]any{
				"target": protocol.Session(dev), "id": r.id, "text": "live " + r.id,
			})
			r.took = time.Since(start)
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // the cron's pace of deliveries through the takeover
		}
	}()
	stopDeliveries := sync.OnceFunc(func() { cancel(); <-stopped })
	t.Cleanup(stopDeliveries)
	testsvc.WaitFor(t, 15*time.Second, "deliveries to the socket on A", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) >= 3
	})

	start := time.Now()
	fresh := c.hello(t, "B", dev)
	ready.Store(true)
	readyIn := time.Since(start)
	oldFrames, ci := readUntilClose(t, old, 5*time.Second)
	closedIn := time.Since(start)
	if ci == nil {
		t.Fatalf("the socket on A was not closed within 5 s of the hello on B:%s", describe(oldFrames))
	}
	if ci.Code != 1000 {
		t.Errorf("the socket on A was closed with %s, want 1000", ci)
	}
	if closedIn > takeoverWithin {
		t.Errorf("the socket on A was closed %v after the hello on B (ready after %v), want within %v", closedIn, readyIn, takeoverWithin)
	}

	// Once B can be reached, deliveries go to B and only there.
	c.waitReachable(t, dev)
	for i := range 5 {
		c.mustDeliver(t, dev, fmt.Sprintf("moved-%d", i), fmt.Sprintf("moved %d", i))
	}
	stopDeliveries()
	c.mustDeliver(t, dev, "marker", "marker")
	newFrames := readUntil(t, fresh, "the marker", finalText("marker"))
	onOld, onNew := idCounts(oldFrames), idCounts(newFrames)
	twice := 0
	for i := range 5 {
		id := fmt.Sprintf("moved-%d", i)
		if onNew[id] != 1 || onOld[id] != 0 {
			t.Errorf("delivery %s after the move arrived %d times on A and %d times on B, want once on B", id, onOld[id], onNew[id])
		}
		delete(onOld, id)
		delete(onNew, id)
	}
	delete(onNew, "marker")
	for _, r := range results {
		o, n := onOld[r.id], onNew[r.id]
		delete(onOld, r.id)
		delete(onNew, r.id)
		// A delivery written to A after B's claim is sent again to B (the
		// owner fence: the phone may have left A's socket already), so it
		// may arrive once on each: the app replaces a message by id.
		again := o == 1 && n == 1
		if again {
			twice++
		}
		switch {
		case errors.Is(r.err, context.Canceled): // stopped in flight: no answer to judge by
			if o+n > 1 && !again {
				t.Errorf("delivery %s arrived %d times on A and %d times on B", r.id, o, n)
			}
		case r.err != nil:
			t.Errorf("delivery %s: %v", r.id, r.err)
		case r.code == http.StatusOK && (o+n == 0 || o+n > 1 && !again):
			t.Errorf("delivery %s (200) arrived %d times on A and %d times on B, want once, or once on each", r.id, o, n)
		case r.code == http.StatusOK && r.ready && o != 0:
			t.Errorf("delivery %s, begun after B's ready, reached the old socket on A", r.id)
		case r.code == http.StatusNotFound && o+n != 0:
			t.Errorf("delivery %s got device_offline but arrived %d times on A and %d on B", r.id, o, n)
		case r.code != http.StatusOK && r.code != http.StatusNotFound:
			t.Errorf("delivery %s: status %d", r.id, r.code)
		}
		if r.took > 2*time.Second {
			t.Logf("delivery %s took %v (answered %d, %v): see TestOutputRacingTakeover", r.id, r.took, r.code, r.err)
		}
	}
	if len(onOld) > 0 || len(onNew) > 0 {
		t.Errorf("messages nobody delivered: on A %v, on B %v", onOld, onNew)
	}
	t.Logf("%d deliveries through the move (%d on both sockets); A closed %v after the hello on B", len(results), twice, closedIn)

	// The new socket is the device: the agent answers there.
	if err := fresh.Text("t-1", "after the move"); err != nil {
		t.Fatal(err)
	}
	readUntil(t, fresh, "the agent's reply", finalText("You said: after the move"))
}

// TestHelloRace (b): two hellos of one device, on edge A and edge B at the
// same moment, many times over. Each race must end with exactly one open
// socket, closed 1000 within 1 s for the other, and the open one receives
// deliveries.
func TestHelloRace(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	const rounds, races = 2, 25
	failures := 0
	for round := range rounds {
		type race struct {
			dev      string
			conns    [2]*client.Conn
			seen     [2]helloOutcome
			survivor int
		}
		rs := make([]*race, races)
		for i := range rs {
			r := &race{dev: newDevice(fmt.Sprintf("race%d-%02d", round, i))}
			r.conns[0], r.conns[1] = c.dial(t, "A"), c.dial(t, "B")
			rs[i] = r
		}
		var wg sync.WaitGroup
		for _, r := range rs {
			start := make(chan struct{})
			for k := range 2 {
				wg.Go(func() {
					<-start
					r.seen[k] = raceHello(r.conns[k], c.token, r.dev)
				})
			}
			close(start)
		}
		wg.Wait()
		for _, r := range rs {
			r.survivor = -1
			a, b := r.seen[0], r.seen[1]
			switch {
			case a.err != nil || b.err != nil:
				t.Errorf("%s: hello on A: %v; on B: %v", r.dev, a.err, b.err)
			case a.closed == nil && b.closed == nil:
				t.Errorf("%s: both sockets still open %v after racing hellos (A ready %v, B ready %v)", r.dev, takeoverWithin, a.ready, b.ready)
			case a.closed != nil && b.closed != nil:
				t.Errorf("%s: both sockets closed (A %s, B %s)", r.dev, a.closed, b.closed)
			default:
				loser, k := a, 1
				if b.closed != nil {
					loser, k = b, 0
				}
				if loser.closed.Code != 1000 {
					t.Errorf("%s: the losing socket was closed with %s, want 1000", r.dev, loser.closed)
				}
				if !r.seen[k].ready {
					t.Errorf("%s: the open socket never got ready: %v", r.dev, r.seen[k].frames)
					continue
				}
				r.survivor = k
			}
			for k, s := range r.seen {
				for _, f := range s.frames {
					if f.T() != protocol.TypeReady {
						t.Errorf("%s on %s: unexpected %s", r.dev, "AB"[k:k+1], f)
					}
				}
			}
		}
		// The open socket is the one deliveries reach.
		for _, r := range rs {
			if r.survivor < 0 {
				failures++
				continue
			}
			c.mustDeliver(t, r.dev, "after-race", "after the race")
			readUntil(t, r.conns[r.survivor], "the delivery after the race", finalText("after the race"))
		}
	}
	if failures > 0 {
		t.Errorf("%d of %d races did not end with exactly one open socket", failures, rounds*races)
	}
}

// helloOutcome is what one socket saw of a racing hello within the takeover
// time: ready, a close, other frames.
type helloOutcome struct {
	ready  bool
	closed *client.CloseInfo
	frames []client.Frame // other than ready and close
	err    error
}

// raceHello sends hello and reads what comes within takeoverWithin after it.
func raceHello(conn *client.Conn, token, dev string) helloOutcome {
	var o helloOutcome
	if err := conn.Send(map[string]any{"t": protocol.TypeHello, "token": token, "device": device(dev), "user": user}); err != nil {
		o.err = err
		return o
	}
	ctx, cancel := context.WithTimeout(context.Background(), takeoverWithin)
	defer cancel()
	for {
		f, err := conn.Next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				o.err = err
			}
			return o
		}
		switch {
		case f.Close() != nil:
			o.closed = f.Close()
			return o
		case f.T() == protocol.TypeReady:
			o.ready = true
		default:
			o.frames = append(o.frames, f)
		}
	}
}

// readUntilClose reads frames until the server's close (returned) or d
// passes (nil).
func readUntilClose(t testing.TB, conn *client.Conn, d time.Duration) ([]client.Frame, *client.CloseInfo) {
	t.Helper()
	ctx := within(t, d)
	var got []client.Frame
	for {
		f, err := conn.Next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				t.Fatalf("the connection ended without a close frame: %v; before: %s", err, describe(got))
			}
			return got, nil
		}
		if ci := f.Close(); ci != nil {
			return got, ci
		}
		got = append(got, f)
	}
}

// idCounts counts the message frames of each id.
func idCounts(fs []client.Frame) map[string]int {
	n := make(map[string]int)
	for _, f := range fs {
		if f.T() == protocol.TypeMessage {
			n[f.Str("id")]++
		}
	}
	return n
}
