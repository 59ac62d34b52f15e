package gateway_test

// Failure behaviour (the cluster issue): Redis or NATS going away under
// running nodes must not crash or wedge them. While a dependency is down a
// phone gets a clear retryable error (a non-fatal internal_error with a
// message, or a fatal one followed by a close for a hello), and everything
// works again within seconds of its return, without restarting the nodes.
//
// Every test starts its own redis-server and nats-server on free ports, so it
// may kill, freeze (SIGSTOP) and restart them; the shared servers on the
// standard ports are never touched. Without the binaries the tests skip, or
// fail when CI is set.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

const (
	// flOpBound is how soon a phone must hear that its frame failed: the
	// edge's op timeout (5 s) plus slack.
	flOpBound = 6 * time.Second
	// flRecover is how soon after a dependency's return things must work.
	flRecover = 10 * time.Second
)

// ---- private servers ----

// flMust fails t on err, as a server that does not come back, freeze or
// thaw leaves nothing to test.
func flMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// flDeps is a private Redis and NATS for one test.
type flDeps struct {
	redis, nats *testsvc.Server
}

func flStartDeps(t *testing.T) *flDeps {
	t.Helper()
	return &flDeps{redis: testsvc.StartRedis(t), nats: testsvc.StartNATS(t)}
}

// flNode is a node of a failure test; with a router, its agent is tracked so
// a test can wait until no agent call (and so no delivery) is in flight.
type flNode struct {
	*node
	tracked *flTracked // nil without a router
}

// node starts a node on d's Redis and NATS; with router it runs the router
// with the demo agent, or the agent mutate sets, recorded and tracked.
func (d *flDeps) node(t *testing.T, router bool, mutate func(*gateway.Config)) *flNode {
	t.Helper()
	var tr *flTracked
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.NATSURL, cfg.RedisURL, cfg.Router = d.nats.URL(), d.redis.URL(), router
		cfg.Agent = agent.Demo{}
		if mutate != nil {
			mutate(cfg)
		}
		if router {
			tr = &flTracked{next: cfg.Agent}
			cfg.Agent = tr
		}
	})
	return &flNode{node: n, tracked: tr}
}

// flTracked counts the agent calls that have returned.
type flTracked struct {
	next agent.Agent
	done atomic.Int64
}

func (a *flTracked) Handle(ctx context.Context, ev wire.Event, out agent.Output) error {
	defer a.done.Add(1)
	return a.next.Handle(ctx, ev, out)
}

// quiesce waits until every event the agent received has been handled, so
// no delivery of the agent's is waiting for an edge's answer. A test calls
// it before it kills a server: a request in flight at that moment is the
// subject of TestFailureDeliveryInFlightWhenNATSDies, not of the others.
func (n *flNode) quiesce(t *testing.T) {
	t.Helper()
	testsvc.WaitFor(t, 10*time.Second, "the agent to have handled every event it got", func() bool {
		return len(n.agent.Events()) == int(n.tracked.done.Load())
	})
}

// ---- phones ----

// flPhone is a connected phone that remembers what it saw, so a failure can
// say what happened instead.
type flPhone struct {
	*client.Conn
	t      *testing.T
	device string
	seen   []string
}

// flConnect says hello as device on n; it must get ready.
func flConnect(t *testing.T, n *flNode, device string) *flPhone {
	t.Helper()
	c, _ := n.connect(t, device)
	return &flPhone{Conn: c, t: t, device: device}
}

// flHello dials n and says hello as device: ready gives a phone; an error
// frame is returned as the *client.ServerError.
func flHello(t *testing.T, n *flNode, device string) (*flPhone, error) {
	t.Helper()
	c := n.dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), flOpBound)
	defer cancel()
	_, err := c.Hello(ctx, testToken, protocol.Device{ID: device, Name: "Phone " + device}, protocol.User{ID: "u-1", Name: "Tester"})
	return &flPhone{Conn: c, t: t, device: device}, err
}

// flConnectWithin says hello as device until it gets ready, for at most
// within; every refusal on the way must be a fatal internal_error.
func flConnectWithin(t *testing.T, n *flNode, device string, within time.Duration) (*flPhone, error) {
	t.Helper()
	start := time.Now()
	var last error
	for time.Since(start) < within {
		p, err := flHello(t, n, device)
		if err == nil {
			return p, nil
		}
		p.CloseNow()
		last = err
		var se *client.ServerError
		if !errors.As(err, &se) || se.Code != protocol.CodeInternalError || !se.Fatal {
			return nil, fmt.Errorf("hello refused with %v, want ready or a fatal internal_error", err)
		}
		time.Sleep(200 * time.Millisecond) // a retrying phone\'s pace, not a wait for a state
	}
	return nil, fmt.Errorf("no ready within %v; last answer: %v", within, last)
}

// flDescribe names a frame briefly.
func flDescribe(f client.Frame) string {
	if f.IsZero() {
		return "nothing"
	}
	if ci := f.Close(); ci != nil {
		return "close(" + ci.String() + ")"
	}
	switch f.T() {
	case protocol.TypeError:
		return fmt.Sprintf("error(%s fatal=%v %q)", f.Str("code"), f.Bool("fatal"), f.Str("message"))
	case protocol.TypeMessage:
		return fmt.Sprintf("message(%s %q final=%v)", f.Str("id"), f.Str("text"), f.Bool("final"))
	case protocol.TypeAvatar:
		return "avatar(" + f.Str("state") + ")"
	}
	return f.T()
}

// history is what the phone saw lately.
func (p *flPhone) history() string {
	s := p.seen
	if len(s) > 30 {
		s = s[len(s)-30:]
	}
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, ", ")
}

// next returns the next frame that is not an avatar state or typing, waiting
// at most d. A close is returned as its frame.
func (p *flPhone) next(d time.Duration) (client.Frame, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		f, err := p.Next(ctx)
		if !f.IsZero() {
			p.seen = append(p.seen, flDescribe(f))
		}
		if err != nil {
			return f, err
		}
		if t := f.T(); t == protocol.TypeAvatar || t == protocol.TypeTyping {
			continue
		}
		return f, nil
	}
}

// expectRetryable checks the answer to what the phone sent at sent while a
// dependency is down: a non-fatal internal_error with a message, within
// flOpBound. It returns the message.
func (p *flPhone) expectRetryable(what string, sent time.Time) string {
	p.t.Helper()
	f, err := p.next(flOpBound)
	took := time.Since(sent)
	if err != nil {
		p.t.Errorf("%s: no answer within %v: %v (the phone saw: %s)", what, flOpBound, err, p.history())
		return ""
	}
	se := client.AsServerError(f)
	if se == nil || se.Code != protocol.CodeInternalError || se.Fatal || se.Message == "" {
		p.t.Errorf("%s: got %s after %v, want a non-fatal internal_error with a message", what, f, took)
		return ""
	}
	p.t.Logf("%s: %s after %v", what, flDescribe(f), took.Round(time.Millisecond))
	return se.Message
}

// expectPong checks that the connection is open and served.
func (p *flPhone) expectPong(what string) {
	p.t.Helper()
	if err := p.Ping("fl-ping"); err != nil {
		p.t.Errorf("%s: ping: %v", what, err)
		return
	}
	f, err := p.next(2 * time.Second)
	if err != nil || f.T() != protocol.TypePong || f.Str("ts") != "fl-ping" {
		p.t.Errorf("%s: ping answered %s (%v); want pong (the phone saw: %s)", what, flDescribe(f), err, p.history())
	}
}

// echo sends text as id and waits for the demo's complete echo; every
// non-fatal internal_error makes it send the same id again, until within
// has passed. It returns how long it took.
func (p *flPhone) echo(id, text string, within time.Duration) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(within)
	want := "You said: " + text
	replies := make(map[string]string)
	attempts := 0
	send := func() error {
		attempts++
		return p.Text(id, text)
	}
	if err := send(); err != nil {
		return 0, err
	}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return time.Since(start), fmt.Errorf("no echo of %q within %v (%d sends of id %q); the phone saw: %s",
				text, within, attempts, id, p.history())
		}
		f, err := p.next(left)
		if errors.Is(err, context.DeadlineExceeded) {
			continue
		}
		if err != nil {
			return time.Since(start), fmt.Errorf("connection lost after %d sends: %v; the phone saw: %s", attempts, err, p.history())
		}
		switch {
		case f.Close() != nil:
			return time.Since(start), fmt.Errorf("the server closed the connection (%s) after %d sends of id %q, before the echo; the phone saw: %s",
				f.Close(), attempts, id, p.history())
		case f.T() == protocol.TypeError:
			se := client.AsServerError(f)
			if se.Code != protocol.CodeInternalError || se.Fatal {
				return time.Since(start), fmt.Errorf("unexpected %s; the phone saw: %s", flDescribe(f), p.history())
			}
			time.Sleep(200 * time.Millisecond) // a retrying phone\'s pace, not a wait for a state
			if err := send(); err != nil {
				return time.Since(start), err
			}
		case f.T() == protocol.TypeMessage:
			mid := f.Str("id")
			if f.Map("chunk").Int("index") == 0 {
				replies[mid] = f.Str("text")
			} else {
				replies[mid] += f.Str("text")
			}
			if f.Bool("final") && replies[mid] == want {
				return time.Since(start), nil
			}
		}
	}
}

// waitMessage waits up to within for a complete message whose text is want,
// ignoring other frames except a close.
func (p *flPhone) waitMessage(want string, within time.Duration) error {
	deadline := time.Now().Add(within)
	replies := make(map[string]string)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("no message %q within %v; the phone saw: %s", want, within, p.history())
		}
		f, err := p.next(left)
		if errors.Is(err, context.DeadlineExceeded) {
			continue
		}
		if err != nil {
			return fmt.Errorf("connection lost: %v; the phone saw: %s", err, p.history())
		}
		if f.Close() != nil {
			return fmt.Errorf("closed (%s) before message %q; the phone saw: %s", f.Close(), want, p.history())
		}
		if f.T() != protocol.TypeMessage {
			continue
		}
		mid := f.Str("id")
		if f.Map("chunk").Int("index") == 0 {
			replies[mid] = f.Str("text")
		} else {
			replies[mid] += f.Str("text")
		}
		if f.Bool("final") && replies[mid] == want {
			return nil
		}
	}
}

// waitMessages waits up to within for complete messages with the texts in
// wants and returns when each arrived, counted from the call.
func (p *flPhone) waitMessages(wants []string, within time.Duration) map[string]time.Duration {
	start := time.Now()
	got := make(map[string]time.Duration)
	replies := make(map[string]string)
	for len(got) < len(wants) {
		left := within - time.Since(start)
		if left <= 0 {
			break
		}
		f, err := p.next(left)
		if errors.Is(err, context.DeadlineExceeded) {
			continue
		}
		if err != nil || f.Close() != nil {
			break
		}
		if f.T() != protocol.TypeMessage {
			continue
		}
		mid := f.Str("id")
		if f.Map("chunk").Int("index") == 0 {
			replies[mid] = f.Str("text")
		} else {
			replies[mid] += f.Str("text")
		}
		if f.Bool("final") && slices.Contains(wants, replies[mid]) {
			got[replies[mid]] = time.Since(start)
		}
	}
	return got
}

// flOpen counts the phones whose connection is still open.
func flOpen(phones ...*flPhone) int {
	n := 0
	for _, p := range phones {
		if p == nil {
			continue
		}
		select {
		case <-p.Done():
		default:
			n++
		}
	}
	return n
}

// flWaitConns checks that n's edge holds exactly the open phones, within 5 s.
func flWaitConns(t *testing.T, n *flNode, what string, phones ...*flPhone) {
	t.Helper()
	var want, got int
	if !testsvc.Eventually(5*time.Second, func() bool {
		want, got = flOpen(phones...), n.Edge.Conns()
		return got == want
	}) {
		t.Errorf("%s: the edge counts %d connections, %d phones are open", what, got, want)
	}
}

// flWaitBus waits until n's bus is connected (up) or fails fast with
// bus.ErrUnavailable (down), probing with a publish.
func flWaitBus(t *testing.T, n *flNode, up bool, within time.Duration) {
	t.Helper()
	var err error
	if !testsvc.Eventually(within, func() bool {
		err = n.Bus.Publish(context.Background(), "hermes.test.probe", []byte("x"), nil)
		return up && err == nil || !up && errors.Is(err, bus.ErrUnavailable)
	}) {
		t.Fatalf("the node's bus did not become up=%v within %v: last publish: %v", up, testsvc.Slack(within), err)
	}
}

// openCard asks the demo for a slash_confirm card and returns its id.
func (p *flPhone) openCard(id, title string) string {
	p.t.Helper()
	if err := p.Text(id, "/confirm "+title); err != nil {
		p.t.Fatal(err)
	}
	for {
		f, err := p.next(5 * time.Second)
		if err != nil {
			p.t.Fatalf("no card for %q: %v; the phone saw: %s", title, err, p.history())
		}
		if f.T() == protocol.TypePrompt && f.Str("kind") == protocol.PromptSlashConfirm {
			return f.Str("id")
		}
	}
}

// answerUnreachable answers card id while the agent side cannot be
// reached: the card closes (prompt_done), a retryable internal_error follows
// within flOpBound, and the card is shown again so it can be answered later.
func (p *flPhone) answerUnreachable(what, id, option string) {
	p.t.Helper()
	sent := time.Now()
	if err := p.Answer(id, option, ""); err != nil {
		p.t.Fatal(err)
	}
	f, err := p.next(flOpBound)
	if err != nil || f.T() != protocol.TypePromptDone || f.Str("id") != id {
		p.t.Errorf("%s: got %s (%v); want prompt_done for %s (the phone saw: %s)", what, flDescribe(f), err, id, p.history())
		return
	}
	if p.expectRetryable(what, sent) == "" {
		return
	}
	f, err = p.next(2 * time.Second)
	if err != nil || f.T() != protocol.TypePrompt || f.Str("id") != id {
		p.t.Errorf("%s: after the internal_error the card was not shown again (got %s within 2 s); the phone cannot answer it any more (the phone saw: %s)",
			what, flDescribe(f), p.history())
	}
}

// resolveCard answers card id with option, again after every
// internal_error, until the demo says want; within bounds it.
func (p *flPhone) resolveCard(id, option, want string, within time.Duration) error {
	deadline := time.Now().Add(within)
	if err := p.Answer(id, option, ""); err != nil {
		return err
	}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("no %q within %v; the phone saw: %s", want, within, p.history())
		}
		f, err := p.next(left)
		if errors.Is(err, context.DeadlineExceeded) {
			continue
		}
		if err != nil {
			return fmt.Errorf("connection lost: %v; the phone saw: %s", err, p.history())
		}
		switch {
		case f.Close() != nil:
			return fmt.Errorf("closed (%s); the phone saw: %s", f.Close(), p.history())
		case f.T() == protocol.TypePromptDone && f.Bool("expired"):
			return fmt.Errorf("the card is gone: the answer got %s; the agent never hears the answer given during the outage; the phone saw: %s",
				f, p.history())
		case f.T() == protocol.TypeError:
			se := client.AsServerError(f)
			if se.Code != protocol.CodeInternalError || se.Fatal {
				return fmt.Errorf("unexpected %s; the phone saw: %s", flDescribe(f), p.history())
			}
			time.Sleep(200 * time.Millisecond) // a retrying phone\'s pace, not a wait for a state
			if err := p.Answer(id, option, ""); err != nil {
				return err
			}
		case f.T() == protocol.TypeMessage && f.Bool("final") && f.Str("text") == want:
			return nil
		}
	}
}

// ---- the tests ----

// TestFailureRedisRestart: Redis is killed mid-conversation. A text gets a
// prompt non-fatal internal_error, the socket stays open (ping needs no
// Redis), a new hello is refused with a fatal internal_error; once Redis is
// back (empty) the same text id is accepted and echoed on the same socket,
// and a new hello gets ready.
func TestFailureRedisRestart(t *testing.T) {
	t.Parallel()
	d := flStartDeps(t)
	n := d.node(t, true, nil)
	p := flConnect(t, n, "tel-redis")
	if _, err := p.echo("r-0", "before the outage", 5*time.Second); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	n.quiesce(t)

	d.redis.Kill()
	sent := time.Now()
	if err := p.Text("r-1", "while redis is down"); err != nil {
		t.Fatal(err)
	}
	p.expectRetryable("text while Redis is down", sent)
	p.expectPong("ping while Redis is down")

	sent = time.Now()
	q, err := flHello(t, n, "tel-redis-new")
	var se *client.ServerError
	switch {
	case err == nil:
		t.Errorf("hello while Redis is down got ready; it cannot record the owner")
	case !errors.As(err, &se) || se.Code != protocol.CodeInternalError || !se.Fatal || se.Message == "":
		t.Errorf("hello while Redis is down: %v, want a fatal internal_error with a message", err)
	default:
		ci, cerr := q.ExpectClose(testCtx(t))
		if cerr != nil {
			t.Errorf("hello while Redis is down: no close after the fatal error: %v", cerr)
		} else {
			t.Logf("hello while Redis is down: %v, then close %s, after %v", err, ci, time.Since(sent).Round(time.Millisecond))
		}
	}
	if took := time.Since(sent); took > flOpBound {
		t.Errorf("hello while Redis is down took %v to be refused, want under %v", took, flOpBound)
	}
	q.CloseNow()
	flWaitConns(t, n, "during the Redis outage", p)

	flMust(t, d.redis.Restart())
	back := time.Now()
	q2, err := flConnectWithin(t, n, "tel-redis-new", flRecover)
	if err != nil {
		t.Errorf("a new connection after Redis came back: %v", err)
	} else {
		t.Logf("a new connection got ready %v after Redis came back", time.Since(back).Round(time.Millisecond))
		if _, err := q2.echo("r-2", "on a new connection", 5*time.Second); err != nil {
			t.Errorf("a new connection after Redis came back: %v", err)
		}
	}

	if took, err := p.echo("r-1", "while redis is down", flRecover); err != nil {
		t.Errorf("after Redis came back, the resent text got no echo on the open connection: %v", err)
		flLogOutbox(t, n, p)
	} else {
		t.Logf("after Redis came back the resent text was echoed in %v", took.Round(time.Millisecond))
	}
	flWaitConns(t, n, "after the Redis outage", p, q2)
}

// TestFailureRedisLosesJournal: the agent's call returns while Redis is
// down, so the router cannot yet remove the entry it handled; Redis comes
// back empty and the phone's next text, acknowledged, starts a new journal.
// The router must handle that text: neither take it for the entry it
// handled before (a new journal's Seqs must not repeat the old's) nor leave
// it to the lease's expiry because its worker was busy failing.
func TestFailureRedisLosesJournal(t *testing.T) {
	t.Parallel()
	d := flStartDeps(t)
	gate := newFlGate()
	n := d.node(t, true, func(cfg *gateway.Config) { cfg.Agent = gate })
	p := flConnect(t, n, "tel-lost-journal")
	if err := p.Text("j-1", "quiet: handled as Redis dies"); err != nil {
		t.Fatal(err)
	}
	n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "j-1" })
	p.expectPong("ping before the outage") // the text was taken

	d.redis.Kill()
	close(gate.open)
	if err := <-gate.handled; err != nil {
		t.Fatalf("the agent's call: %v", err)
	}
	// The router now fails to read the journal and retries.
	flMust(t, d.redis.Restart())
	if took, err := p.echo("j-2", "after the outage", flRecover); err != nil {
		t.Errorf("the text sent after Redis came back empty was never answered: %v", err)
	} else {
		t.Logf("the text sent after Redis came back was answered in %v", took.Round(time.Millisecond))
	}
	flWaitConns(t, n, "after the Redis outage", p)
}

// flLogOutbox reconnects p's device, to tell whether what p missed went to
// the device's outbox (diagnosis for a failed echo).
func flLogOutbox(t *testing.T, n *flNode, p *flPhone) {
	t.Helper()
	p.CloseNow()
	r, err := flHello(t, n, p.device)
	if err != nil {
		t.Logf("diagnosis: reconnecting %s failed: %v", p.device, err)
		return
	}
	r.next(2 * time.Second) // collect what comes
	for {
		if _, err := r.next(300 * time.Millisecond); err != nil {
			break
		}
	}
	t.Logf("diagnosis: a new connection of %s received: %s", p.device, r.history())
	r.CloseNow()
}

// TestFailureNATSRestart: NATS is killed mid-conversation under two nodes
// (the phone on one, the router and a cron connection on the other). A
// text gets a prompt internal_error, the socket stays open, a deliver gets a
// retryable error; once NATS is back the subscriptions are re-established:
// the resent text is echoed and a deliver from the other node arrives.
func TestFailureNATSRestart(t *testing.T) {
	t.Parallel()
	d := flStartDeps(t)
	a := d.node(t, false, nil)
	b := d.node(t, true, nil)
	p := flConnect(t, a, "tel-nats")
	cron := flConnect(t, b, "cron-nats")
	if _, err := p.echo("n-0", "before the outage", 5*time.Second); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	if err := cron.Deliver("d-0", "mobile:tel-nats", "cron before the outage", nil); err != nil {
		t.Fatal(err)
	}
	if err := p.waitMessage("cron before the outage", 5*time.Second); err != nil {
		t.Fatalf("deliver before the outage: %v", err)
	}
	if f, err := cron.next(5 * time.Second); err != nil || f.T() != protocol.TypeDelivered || f.Str("id") != "d-0" {
		t.Fatalf("the deliver's sender got %s (%v), want delivered d-0", flDescribe(f), err)
	}
	card := p.openCard("n-c", "Deploy now")
	b.quiesce(t)
	p.expectPong("ping before the outage")    // the edges have handled all
	cron.expectPong("ping before the outage") // frames before (and their acks)

	d.nats.Kill()
	flWaitBus(t, a, false, 5*time.Second) // a request already in flight is TestFailureNATSHungThenRestarted's case
	flWaitBus(t, b, false, 5*time.Second)
	sent := time.Now()
	if err := p.Text("n-1", "while nats is down"); err != nil {
		t.Fatal(err)
	}
	p.expectRetryable("text while NATS is down", sent)
	p.expectPong("ping while NATS is down")
	p.answerUnreachable("card answer while NATS is down", card, protocol.OptionOnce)
	sent = time.Now()
	if err := cron.Deliver("d-1", "mobile:tel-nats", "cron during the outage", nil); err != nil {
		t.Fatal(err)
	}
	cron.expectRetryable("deliver while NATS is down", sent)

	// A hello while NATS is down: ready (the subscription is made once NATS
	// is back) or a fatal internal_error; a ready socket must work later.
	late, err := flHello(t, a, "tel-nats-late")
	if err != nil {
		var se *client.ServerError
		if !errors.As(err, &se) || se.Code != protocol.CodeInternalError || !se.Fatal {
			t.Errorf("hello while NATS is down: %v, want ready or a fatal internal_error", err)
		}
		t.Logf("hello while NATS is down: %v", err)
		late.CloseNow()
		late = nil
	} else {
		t.Logf("hello while NATS is down: ready")
	}

	flMust(t, d.nats.Restart())
	back := time.Now()
	if took, err := p.echo("n-1", "while nats is down", flRecover); err != nil {
		t.Errorf("after NATS came back, the resent text: %v", err)
	} else {
		t.Logf("after NATS came back the resent text was echoed in %v", took.Round(time.Millisecond))
	}

	if err := p.resolveCard(card, protocol.OptionOnce, "slash_confirm resolved: once", flRecover); err != nil {
		t.Errorf("after NATS came back, answering the card again: %v", err)
	}

	// Deliveries to the phone's edge work again: cron on the other node.
	delivered := false
	start := time.Now()
	for i := 0; !delivered && time.Since(start) < flRecover; i++ {
		text, id := fmt.Sprintf("cron after the outage %d", i), fmt.Sprintf("d-2-%d", i)
		if err := cron.Deliver(id, "mobile:tel-nats", text, nil); err != nil {
			t.Fatal(err)
		}
		f, err := cron.next(flOpBound)
		if err != nil || f.T() != protocol.TypeDelivered || f.Str("id") != id {
			t.Logf("deliver after NATS came back: %s (%v)", flDescribe(f), err)
			time.Sleep(200 * time.Millisecond) // a retrying phone\'s pace, not a wait for a state
			continue
		}
		delivered = p.waitMessage(text, 2*time.Second) == nil
	}
	if !delivered {
		t.Errorf("after NATS came back, no deliver from the other node reached the phone within %v; the phone saw: %s; cron saw: %s",
			flRecover, p.history(), cron.history())
	} else {
		t.Logf("a deliver from the other node arrived %v after NATS came back", time.Since(back).Round(time.Millisecond))
	}

	if late != nil {
		if _, err := late.echo("n-late", "hello during the outage", flRecover); err != nil {
			t.Errorf("the connection whose hello came during the NATS outage: %v", err)
		}
	}
	flWaitConns(t, a, "node a after the NATS outage", p, late)
	flWaitConns(t, b, "node b after the NATS outage", cron)
}

// flGate is an agent that holds texts starting with "slow:" until the test
// opens the gate, then answers like the demo and reports the result. Texts
// starting with "quiet:" are held the same way and then return nil without
// an answer.
type flGate struct {
	open    chan struct{}
	handled chan error
	sending chan struct{} // a held text's answer is being sent (Message called)
}

func newFlGate() *flGate {
	return &flGate{open: make(chan struct{}), handled: make(chan error, 16), sending: make(chan struct{}, 16)}
}

// flSending is an agent.Output that tells the gate when a message starts
// on its way.
type flSending struct {
	agent.Output
	sending chan<- struct{}
}

func (o flSending) Message(ctx context.Context, id, text string, edit, final bool) error {
	select {
	case o.sending <- struct{}{}:
	default: // nobody waits for more than the first
	}
	return o.Output.Message(ctx, id, text, edit, final)
}

func (g *flGate) Handle(ctx context.Context, ev wire.Event, out agent.Output) error {
	slow, quiet := strings.HasPrefix(ev.Text, "slow:"), strings.HasPrefix(ev.Text, "quiet:")
	if ev.Kind == wire.EventText && (slow || quiet) {
		select {
		case <-g.open:
		case <-ctx.Done():
			return ctx.Err()
		}
		if quiet {
			g.handled <- nil
			return nil
		}
		err := agent.Demo{}.Handle(ctx, ev, flSending{out, g.sending})
		g.handled <- err
		return err
	}
	return agent.Demo{}.Handle(ctx, ev, out)
}

// TestFailureReplyDuringNATSOutage: the agent has taken a text and answers
// while NATS is down. The answer must reach the phone after NATS returns:
// on the open socket, or at least from the outbox after a reconnection.
func TestFailureReplyDuringNATSOutage(t *testing.T) {
	t.Parallel()
	d := flStartDeps(t)
	gate := newFlGate()
	n := d.node(t, true, func(cfg *gateway.Config) { cfg.Agent = gate })
	p := flConnect(t, n, "tel-reply")
	if err := p.Text("s-1", "slow: think about it"); err != nil {
		t.Fatal(err)
	}
	n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "s-1" })
	// The edge handles a socket's frames in order: the pong says the text
	// was taken (the router's acknowledgement came), not refused.
	p.expectPong("ping before the outage")

	d.nats.Kill()
	flWaitBus(t, n, false, 5*time.Second)
	close(gate.open)
	select {
	case err := <-gate.handled:
		t.Logf("the agent answered while NATS was down; its Output returned: %v", err)
	case <-time.After(time.Second):
		t.Logf("the agent answered while NATS was down; its Output is still waiting after 1 s")
	}
	flMust(t, d.nats.Restart())
	flWaitBus(t, n, true, flRecover)

	const want = "You said: slow: think about it"
	err := p.waitMessage(want, flRecover)
	if err == nil {
		flWaitConns(t, n, "after the NATS outage", p)
		return
	}
	t.Logf("on the open socket: %v", err)
	p.CloseNow()
	r, herr := flHello(t, n, p.device)
	if herr != nil {
		t.Fatalf("reconnecting: %v", herr)
	}
	if err := r.waitMessage(want, 3*time.Second); err != nil {
		t.Errorf("the agent's reply produced while NATS was down is lost: not on the open socket within %v after NATS came back, and not in the outbox on reconnection (%v)", flRecover, err)
	}
	flWaitConns(t, n, "after the NATS outage", r)
}

// TestFailureReplyDuringRedisOutage: the agent answers a text it already
// took while Redis (which keeps its data on disk) is down, so its answer can be neither delivered (the
// owner is unknown) nor kept in the outbox. The router must not drop it:
// it tries both again until Redis is back, and the phone gets the answer.
func TestFailureReplyDuringRedisOutage(t *testing.T) {
	t.Parallel()
	d := &flDeps{redis: testsvc.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always"), nats: testsvc.StartNATS(t)}
	gate := newFlGate()
	const retryFor = 500 * time.Millisecond
	n := d.node(t, true, func(cfg *gateway.Config) { cfg.Agent, cfg.RouterCfg.RetryFor = gate, retryFor })
	p := flConnect(t, n, "tel-redis-reply")
	if err := p.Text("r-1", "slow: keep this"); err != nil {
		t.Fatal(err)
	}
	n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "r-1" })
	p.expectPong("ping before the outage") // the text was taken

	d.redis.Kill()
	close(gate.open)
	// Past the router's retries of the delivery, the answer can be kept
	// nowhere; the agent's Output must keep trying instead of failing.
	select {
	case err := <-gate.handled:
		t.Fatalf("the agent's answer returned %v while Redis was down: an answer that could not be kept is dropped", err)
	case <-time.After(retryFor + 3*time.Second):
	}
	flMust(t, d.redis.Restart())

	const want = "You said: slow: keep this"
	if err := p.waitMessage(want, flRecover+5*time.Second); err != nil {
		t.Errorf("the answer produced while Redis was down never arrived: %v", err)
	}
	if err := <-gate.handled; err != nil {
		t.Errorf("the agent's answer returned %v after Redis came back", err)
	}
}

// TestFailureDeliveryInFlightWhenNATSDies: the agent's answer is on its way
// (a request to the device's edge) when NATS hangs and is restarted. Once
// NATS is back, the answer must reach the phone, and the device's next text
// must be answered, within seconds.
func TestFailureDeliveryInFlightWhenNATSDies(t *testing.T) {
	t.Parallel()
	d := flStartDeps(t)
	gate := newFlGate()
	n := d.node(t, true, func(cfg *gateway.Config) { cfg.Agent = gate })
	p := flConnect(t, n, "tel-inflight")
	if err := p.Text("f-1", "slow: in flight"); err != nil {
		t.Fatal(err)
	}
	n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "f-1" })
	p.expectPong("ping before the outage") // the text was taken, not refused

	flMust(t, d.nats.Freeze())
	close(gate.open) // the agent's first output goes to the frozen server
	testsvc.WaitChan(t, 5*time.Second, "the agent's answer to be on its way to the frozen server", gate.sending)

	flMust(t, d.nats.Restart())
	back := time.Now()
	flWaitBus(t, n, true, flRecover)
	if err := p.Text("f-2", "after the outage"); err != nil {
		t.Fatal(err)
	}
	got := p.waitMessages([]string{"You said: slow: in flight", "You said: after the outage"}, flRecover-time.Since(back))
	for _, want := range []string{"You said: slow: in flight", "You said: after the outage"} {
		if _, ok := got[want]; !ok {
			t.Errorf("%q did not reach the phone within %v of NATS's return; the phone saw: %s", want, flRecover, p.history())
		}
	}
	if len(got) < 2 {
		// Diagnosis: does it come later, and when?
		more := p.waitMessages([]string{"You said: slow: in flight", "You said: after the outage"}, 7*time.Second)
		for k, v := range more {
			t.Logf("diagnosis: %q arrived %v after NATS came back", k, (flRecover + v).Round(100*time.Millisecond))
		}
	}
	select {
	case err := <-gate.handled:
		t.Logf("the agent's Output for the answer in flight returned: %v", err)
	default:
	}
	flWaitConns(t, n, "after the NATS outage", p)
}

// TestFailureNATSHungThenRestarted: NATS stops answering (frozen) and is
// then restarted, as a supervisor does with a hung server. The text sent
// while it hung gets a retryable error after the op timeout; after the
// restart the phone's resend of the same id must be taken (the edge must
// have released the dedup key) and echoed.
func TestFailureNATSHungThenRestarted(t *testing.T) {
	t.Parallel()
	d := flStartDeps(t)
	n := d.node(t, true, nil)
	p := flConnect(t, n, "tel-hung-nats")
	if _, err := p.echo("h-0", "before the outage", 5*time.Second); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	n.quiesce(t)

	flMust(t, d.nats.Freeze())
	sent := time.Now()
	if err := p.Text("h-1", "while nats hangs"); err != nil {
		t.Fatal(err)
	}
	p.expectRetryable("text while NATS hangs", sent)
	p.expectPong("ping while NATS hangs")
	flMust(t, d.nats.Restart()) // SIGKILL works on a stopped process; what it held is gone

	if took, err := p.echo("h-1", "while nats hangs", flRecover); err != nil {
		t.Errorf("after NATS was restarted, the resent text (the id the edge told the phone to send again): %v", err)
	} else {
		t.Logf("after NATS was restarted the resent text was echoed in %v", took.Round(time.Millisecond))
	}
	flWaitConns(t, n, "after the NATS outage", p)
}

// TestFailureCardAnswerWhileNATSHangs: a card is answered while NATS hangs.
// After the op timeout the phone gets prompt_done, a retryable
// internal_error and the card again; once NATS is restarted, answering it
// again reaches the agent.
func TestFailureCardAnswerWhileNATSHangs(t *testing.T) {
	t.Parallel()
	d := flStartDeps(t)
	n := d.node(t, true, nil)
	p := flConnect(t, n, "tel-hung-card")
	card := p.openCard("k-0", "Deploy now")
	n.quiesce(t)

	flMust(t, d.nats.Freeze())
	p.answerUnreachable("card answer while NATS hangs", card, protocol.OptionOnce)
	flMust(t, d.nats.Restart())
	if err := p.resolveCard(card, protocol.OptionOnce, "slash_confirm resolved: once", flRecover); err != nil {
		t.Errorf("after NATS was restarted, answering the card again: %v", err)
	}
	flWaitConns(t, n, "after the NATS outage", p)
}

// TestFailureRedisHung: Redis stops answering (frozen) and resumes. A text
// sent while it hangs gets a retryable error after the op timeout; once
// Redis answers again the resend of the same id must be echoed, not dropped
// as a duplicate of the attempt that failed.
func TestFailureRedisHung(t *testing.T) {
	t.Parallel()
	d := flStartDeps(t)
	n := d.node(t, true, nil)
	p := flConnect(t, n, "tel-hung-redis")
	if _, err := p.echo("z-0", "before the outage", 5*time.Second); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	n.quiesce(t)

	flMust(t, d.redis.Freeze())
	sent := time.Now()
	if err := p.Text("z-1", "while redis hangs"); err != nil {
		t.Fatal(err)
	}
	p.expectRetryable("text while Redis hangs", sent)
	p.expectPong("ping while Redis hangs")
	flMust(t, d.redis.Thaw())

	if took, err := p.echo("z-1", "while redis hangs", flRecover); err != nil {
		t.Errorf("after Redis answered again, the resent text (the id the edge told the phone to send again): %v", err)
	} else {
		t.Logf("after Redis answered again the resent text was echoed in %v", took.Round(time.Millisecond))
	}
	flWaitConns(t, n, "after the Redis outage", p)
}

// TestFailureOrphanedClaim: Redis hangs while the edge claims a text's id;
// the edge gives up (the phone hears internal_error) but the claim runs in
// Redis once it answers again, with nobody left to hand the text over. The
// phone does what the error table says: it reconnects and sends the same id
// again. The resend must reach the agent (told to wait while the orphaned
// claim is pending, never dropped as a duplicate of a text the agent never
// got).
func TestFailureOrphanedClaim(t *testing.T) {
	t.Parallel()
	d := flStartDeps(t)
	const claimTTL = 3 * time.Second
	n := d.node(t, true, func(cfg *gateway.Config) { cfg.Edge.OpTimeout, cfg.Edge.ClaimTTL = time.Second, claimTTL })
	p := flConnect(t, n, "tel-orphan")
	if _, err := p.echo("o-0", "before the outage", 5*time.Second); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	n.quiesce(t)

	flMust(t, d.redis.Freeze())
	sent := time.Now()
	if err := p.Text("o-1", "claimed while redis hangs"); err != nil {
		t.Fatal(err)
	}
	p.expectRetryable("text while Redis hangs", sent)
	p.CloseNow() // the app reconnects
	flMust(t, d.redis.Thaw())

	p2, err := flConnectWithin(t, n, "tel-orphan", flRecover)
	if err != nil {
		t.Fatal(err)
	}
	if took, err := p2.echo("o-1", "claimed while redis hangs", flRecover+claimTTL); err != nil {
		t.Errorf("the resend on a new connection: %v", err)
	} else {
		t.Logf("the resend on a new connection was echoed after %v", took.Round(time.Millisecond))
	}
	if got := n.agent.count(func(ev wire.Event) bool { return ev.ID == "o-1" }); got != 1 {
		t.Errorf("the agent got o-1 %d times, want once", got)
	}
}

// TestFailureOutagesLeakNothing: many frames and hellos fail during a Redis
// and then a NATS outage; afterwards the edge counts exactly the open
// phones and the process is back to its goroutine count. Not parallel: it
// counts the goroutines of the whole process.
func TestFailureOutagesLeakNothing(t *testing.T) {
	d := flStartDeps(t)
	n := d.node(t, true, nil)
	phones := []*flPhone{flConnect(t, n, "tel-leak-1"), flConnect(t, n, "tel-leak-2")}
	for i, p := range phones {
		if _, err := p.echo(fmt.Sprintf("l-0-%d", i), "before", 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	base := flSettledGoroutines()

	const texts, hellos = 20, 5
	outage := func(name string, dep *testsvc.Server) {
		n.quiesce(t)
		for _, p := range phones {
			p.expectPong("ping before the " + name + " outage")
		}
		dep.Kill()
		if name == "NATS" {
			flWaitBus(t, n, false, 5*time.Second)
		}
		p := phones[0]
		for i := range texts {
			sent := time.Now()
			if err := p.Text(fmt.Sprintf("l-%s-%d", name, i), "during the outage"); err != nil {
				t.Fatal(err)
			}
			if p.expectRetryable(name+" outage text", sent) == "" {
				break
			}
		}
		for i := range hellos {
			q, err := flHello(t, n, fmt.Sprintf("tel-leak-%s-%d", name, i))
			if err != nil {
				var se *client.ServerError
				if !errors.As(err, &se) || se.Code != protocol.CodeInternalError {
					t.Errorf("hello during the %s outage: %v", name, err)
				}
			}
			q.CloseNow()
		}
		phones[1].expectPong("ping during the " + name + " outage")
		flMust(t, dep.Restart())
		// Whatever the outage did to the sockets, new ones must work.
		for i, old := range phones {
			old.Close()
			p, err := flConnectWithin(t, n, old.device, flRecover)
			if err != nil {
				t.Fatalf("reconnecting after the %s outage: %v", name, err)
			}
			if _, err := p.echo(fmt.Sprintf("l-%s-after-%d", name, i), "after", flRecover); err != nil {
				t.Fatalf("after the %s outage: %v", name, err)
			}
			phones[i] = p
		}
		flWaitConns(t, n, "after the "+name+" outage", phones...)
	}
	outage("Redis", d.redis)
	outage("NATS", d.nats)

	// Two phones were reconnected twice; nothing else should remain.
	const slack = 10
	var got int
	if testsvc.Eventually(5*time.Second, func() bool {
		got = runtime.NumGoroutine()
		return got <= base+slack
	}) {
		t.Logf("goroutines: %d before the outages, %d after", base, got)
	} else {
		var buf bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&buf, 1)
		t.Errorf("goroutines: %d before the outages, %d after (%d failed texts and %d failed hellos per outage)\n%s",
			base, got, texts, hellos, buf.String())
	}
}

// flSettledGoroutines returns the goroutine count once it stopped moving.
func flSettledGoroutines() int {
	last := runtime.NumGoroutine()
	for range 20 {
		time.Sleep(50 * time.Millisecond) // the sampling interval of a count that has no event to wait for
		n := runtime.NumGoroutine()
		if n == last {
			return n
		}
		last = n
	}
	return last
}
