package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// journalEnv is routers sharing a real Redis and a real NATS under prefixes
// of the test's, and a bus connection that plays the edge.
type journalEnv struct {
	redisURL, prefix string
	natsURL, subj    string
	edge             *natsbus.Bus
}

func newJournalEnv(t *testing.T) *journalEnv {
	t.Helper()
	e := &journalEnv{
		redisURL: testsvc.RedisURL(t), prefix: "hermes-journaltest:" + testsvc.RandomHex(6) + ":",
		natsURL: testsvc.NATSURL(t), subj: "jt" + testsvc.RandomHex(3) + ".",
	}
	cleanRedis(t, e.redisURL, e.prefix)
	b, err := natsbus.Connect(e.natsURL, natsbus.Options{Name: "journal-edge", SubjectPrefix: e.subj})
	if err != nil {
		t.Fatalf("natsbus: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	e.edge = b
	return e
}

// router starts a router with its own store client and bus connection, as
// a process of its own would have. The returned store is its store.
func (e *journalEnv) router(t *testing.T, name string, cfg router.Config, a agent.Agent) (*router.Router, *redisstore.Store) {
	t.Helper()
	st, err := redisstore.New(t.Context(), redisstore.Options{URL: e.redisURL, Prefix: e.prefix})
	if err != nil {
		t.Fatalf("redisstore: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	b, err := natsbus.Connect(e.natsURL, natsbus.Options{Name: name, SubjectPrefix: e.subj})
	if err != nil {
		t.Fatalf("natsbus: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	r := router.New(cfg, st, b, a, testLogger(t, name))
	if err := r.Start(); err != nil {
		t.Fatalf("router: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r, st
}

// send hands a text event to the routers as an edge does and returns the
// router's verdict.
func (e *journalEnv) send(t *testing.T, device, id string) wire.Reply {
	t.Helper()
	data, _ := json.Marshal(wire.Event{Kind: wire.EventText, Device: device, Session: "mobile:" + device, ID: id, Text: id})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	reply, err := e.edge.Request(ctx, bus.InboundSubject, data, nil)
	if err != nil {
		t.Fatalf("request %s: %v", id, err)
	}
	var rep wire.Reply
	if err := json.Unmarshal(reply, &rep); err != nil {
		t.Fatalf("reply %q: %v", reply, err)
	}
	return rep
}

func (e *journalEnv) mustSend(t *testing.T, device, id string) {
	t.Helper()
	if rep := e.send(t, device, id); !rep.OK {
		t.Fatalf("event %s refused: %s", id, rep.Error)
	}
}

// recorder is an agent that records what it handles, by whom, and fails the
// test when one device's events overlap. With hold set, each call waits
// until hold is closed (ignoring its context when deaf is set, like a router
// cut off from everything).
type recorder struct {
	t     *testing.T
	mu    *sync.Mutex
	log   *[]string       // "<device>/<id>" in the order calls started
	by    *[]string       // the name of the router of each call
	busy  map[string]bool // devices with a call in progress
	name  string
	delay time.Duration
	hold  chan struct{}
	deaf  bool
	began chan string // each call's id, when not nil
}

func newRecorder(t *testing.T) *recorder {
	return &recorder{t: t, mu: new(sync.Mutex), log: new([]string), by: new([]string), busy: make(map[string]bool)}
}

// as returns a recorder sharing r's records, for another router.
func (r *recorder) as(name string) *recorder {
	c := *r
	c.name, c.hold, c.deaf, c.began, c.delay = name, nil, false, nil, 0
	return &c
}

func (r *recorder) Handle(ctx context.Context, ev wire.Event, _ agent.Output) error {
	r.mu.Lock()
	if r.busy[ev.Device] {
		r.t.Errorf("%s: two events of %s handled at once (%s)", r.name, ev.Device, ev.ID)
	}
	// A deaf call is a router cut off from the cluster: it does not count.
	r.busy[ev.Device] = !r.deaf
	*r.log = append(*r.log, ev.Device+"/"+ev.ID)
	*r.by = append(*r.by, r.name)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.busy[ev.Device] = false
		r.mu.Unlock()
	}()
	if r.began != nil {
		r.began <- ev.ID
	}
	if r.hold != nil {
		if r.deaf {
			<-r.hold
		} else {
			select {
			case <-r.hold:
			case <-ctx.Done():
			}
		}
	}
	time.Sleep(r.delay) // the agent's time at work, which the test sets
	return nil
}

// handled returns the records so far.
func (r *recorder) handled() (log, by []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(*r.log), slices.Clone(*r.by)
}

// waitHandled waits until the log holds want (in this order, possibly after
// repeats of earlier entries) and returns how long that took.
func (r *recorder) waitHandled(t *testing.T, within time.Duration, want ...string) time.Duration {
	t.Helper()
	start := time.Now()
	var log []string
	if !testsvc.Eventually(within, func() bool {
		log, _ = r.handled()
		return len(log) >= len(want) && slices.Equal(log[len(log)-len(want):], want)
	}) {
		t.Fatalf("handled %q, want it to end with %q within %v", log, want, testsvc.Slack(within))
	}
	return time.Since(start)
}

// TestJournalOrderAcrossRouters: events of one device taken by two routers
// (the queue group spreads them) are handled one at a time and in the
// order they were acknowledged.
func TestJournalOrderAcrossRouters(t *testing.T) {
	e := newJournalEnv(t)
	rec := newRecorder(t)
	a, b := rec.as("a"), rec.as("b")
	a.delay, b.delay = 5*time.Millisecond, 5*time.Millisecond
	e.router(t, "a", router.Config{}, a)
	e.router(t, "b", router.Config{}, b)
	devs := []string{"tel-" + testsvc.RandomHex(3), "tel-" + testsvc.RandomHex(3)}
	var want []string
	var wg sync.WaitGroup
	for _, d := range devs {
		var mine []string
		for i := range 40 {
			mine = append(mine, fmt.Sprintf("%s/%02d", d, i))
		}
		want = append(want, mine...)
		wg.Go(func() {
			for _, m := range mine {
				e.mustSend(t, d, strings.TrimPrefix(m, d+"/"))
			}
		})
	}
	wg.Wait()
	testsvc.WaitFor(t, 20*time.Second, fmt.Sprintf("the routers to handle all %d events", len(want)), func() bool {
		log, _ := rec.handled()
		return len(log) == len(want)
	})
	log, _ := rec.handled()
	for _, d := range devs {
		var got, exp []string
		for _, l := range log {
			if strings.HasPrefix(l, d+"/") {
				got = append(got, l)
			}
		}
		for _, w := range want {
			if strings.HasPrefix(w, d+"/") {
				exp = append(exp, w)
			}
		}
		if !slices.Equal(got, exp) {
			t.Errorf("%s handled in the order %q, want %q", d, got, exp)
		}
	}
}

// TestJournalBound: a device's journal holds SessionQueue events, the one in
// progress included; the next is refused until one is done.
func TestJournalBound(t *testing.T) {
	e := newJournalEnv(t)
	rec := newRecorder(t)
	a := rec.as("a")
	a.hold = make(chan struct{})
	e.router(t, "a", router.Config{SessionQueue: 3}, a)
	dev := "tel-" + testsvc.RandomHex(3)
	for _, id := range []string{"1", "2", "3"} {
		e.mustSend(t, dev, id)
	}
	rep := e.send(t, dev, "4")
	if rep.OK || !strings.Contains(rep.Error, "busy") {
		t.Fatalf("the fourth event = %+v, want refused as busy", rep)
	}
	close(a.hold)
	a.waitHandled(t, 5*time.Second, dev+"/1", dev+"/2", dev+"/3")
	e.mustSend(t, dev, "4")
	a.waitHandled(t, 5*time.Second, dev+"/4")
}

// TestJournalCloseHandsOver: a router closing with an agent call in
// progress cancels it after CloseGrace and releases the journal: another
// router handles the interrupted event and the ones behind it at once, not
// after the lease.
func TestJournalCloseHandsOver(t *testing.T) {
	e := newJournalEnv(t)
	rec := newRecorder(t)
	a := rec.as("a")
	a.hold, a.began = make(chan struct{}), make(chan string, 10)
	ra, _ := e.router(t, "a", router.Config{CloseGrace: 200 * time.Millisecond}, a)
	dev := "tel-" + testsvc.RandomHex(3)
	e.mustSend(t, dev, "1")
	e.mustSend(t, dev, "2")
	<-a.began
	e.router(t, "b", router.Config{}, rec.as("b"))
	start := time.Now()
	ra.Close()
	rec.waitHandled(t, 5*time.Second, dev+"/1", dev+"/2")
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("handed over after %v", took)
	}
	_, by := rec.handled()
	if want := []string{"a", "b", "b"}; !slices.Equal(by, want) {
		t.Fatalf("handled by %q, want %q", by, want)
	}
}

// TestJournalTakeoverAfterLease: a router cut off from Redis mid-call (its
// agent call hangs) stops renewing its lease; another router's sweeper takes
// the journal once the lease expired and handles the acknowledged events,
// the interrupted one again. a's backlog holds the journal while it hangs;
// b counts the takeover, and its backlog is back at 0 once it is done.
func TestJournalTakeoverAfterLease(t *testing.T) {
	e := newJournalEnv(t)
	rec := newRecorder(t)
	a := rec.as("a")
	a.hold, a.deaf, a.began = make(chan struct{}), true, make(chan string, 10)
	defer close(a.hold)
	lease := time.Second
	tela, telb := newTelemetry(t), newTelemetry(t)
	_, sta := e.router(t, "a", router.Config{JournalLease: lease, CloseGrace: 100 * time.Millisecond, Telemetry: tela}, a)
	dev := "tel-" + testsvc.RandomHex(3)
	e.mustSend(t, dev, "1")
	e.mustSend(t, dev, "2")
	<-a.began
	if m := samplesOf(t, tela); m["hermes_journal_backlog"] != 1 {
		t.Errorf("router a, its agent call on the journal hanging: hermes_journal_backlog = %v, want 1", m["hermes_journal_backlog"])
	}
	e.router(t, "b", router.Config{JournalLease: lease, Telemetry: telb}, rec.as("b"))
	sta.Close() // a can no longer renew its lease
	took := rec.waitHandled(t, lease+4*time.Second, dev+"/1", dev+"/2")
	if took < lease/2 {
		t.Fatalf("taken over after %v, before the %v lease could expire", took, lease)
	}
	if _, by := rec.handled(); !slices.Equal(by, []string{"a", "b", "b"}) {
		t.Fatalf("handled by %q, want a then b twice", by)
	}
	if m := samplesOf(t, telb); m["hermes_journal_takeovers_total"] != 1 {
		t.Errorf("router b: hermes_journal_takeovers_total = %v, want 1", m["hermes_journal_takeovers_total"])
	}
	testsvc.WaitFor(t, 5*time.Second, "router b's hermes_journal_backlog to return to 0 after it handled the journal",
		func() bool { return samplesOf(t, telb)["hermes_journal_backlog"] == 0 })
}

// newTelemetry is a router's telemetry, shut down when t ends.
func newTelemetry(t *testing.T) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	return tel
}

// samplesOf scrapes tel's /metrics: sample name{labels} → value.
func samplesOf(t *testing.T, tel *telemetry.Telemetry) map[string]float64 {
	t.Helper()
	return testsvc.Samples(t, tel.Handler())
}

// TestJournalDropsPoisonEvent: an event whose agent call never returns
// takes its routers down one after another (each is cut off from Redis
// mid-call, so its lease expires). The journal is taken over MaxAttempts-1
// times and the agent still gets the event; at the MaxAttempts-th takeover
// the router drops it without calling the agent, tells the phone with a
// final message, ends the avatar idle, and handles the next event.
func TestJournalDropsPoisonEvent(t *testing.T) {
	e := newJournalEnv(t)
	dev := "tel-" + testsvc.RandomHex(3)
	var mu sync.Mutex
	var phone []wire.Output
	// The phone is connected to the edge "journal-edge": its owner record
	// names it, and what the routers send comes on the edge's subject.
	st, err := redisstore.New(t.Context(), redisstore.Options{URL: e.redisURL, Prefix: e.prefix})
	if err != nil {
		t.Fatalf("redisstore: %v", err)
	}
	defer st.Close()
	if _, err := st.ClaimDevice(t.Context(), dev, "journal-edge", time.Hour); err != nil {
		t.Fatalf("claim: %v", err)
	}
	sub, err := e.edge.Subscribe(bus.EdgeOutputSubject("journal-edge"), func(m *bus.Msg) {
		var out wire.Output
		if err := json.Unmarshal(m.Data, &out); err != nil {
			t.Errorf("output %q: %v", m.Data, err)
		}
		mu.Lock()
		phone = append(phone, out)
		mu.Unlock()
		if m.Respond != nil { // typing is published
			m.Respond([]byte(`{"ok":true}`))
		}
	})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer sub.Unsubscribe()

	const attempts = 3
	lease := time.Second
	cfg := router.Config{JournalLease: lease, MaxAttempts: attempts, CloseGrace: 100 * time.Millisecond}
	rec := newRecorder(t)
	hold := make(chan struct{})
	defer close(hold)
	var want, wantBy []string
	for i := range attempts {
		name := fmt.Sprint("dying", i)
		a := rec.as(name)
		a.hold, a.deaf, a.began = hold, true, make(chan string, 10)
		_, st := e.router(t, name, cfg, a)
		if i == 0 {
			e.mustSend(t, dev, "poison")
			e.mustSend(t, dev, "next")
		}
		select {
		case id := <-a.began:
			if id != "poison" {
				t.Fatalf("%s began %q, want the poison event", name, id)
			}
		case <-time.After(lease + 5*time.Second):
			t.Fatalf("%s did not get the poison event after %d takeovers", name, i)
		}
		st.Close() // the router dies: its lease expires
		want, wantBy = append(want, dev+"/poison"), append(wantBy, name)
	}
	// attempts-1 takeovers still reached the agent; the next one drops.
	e.router(t, "last", cfg, rec.as("last"))
	rec.waitHandled(t, lease+5*time.Second, dev+"/next")
	log, by := rec.handled()
	if want, wantBy = append(want, dev+"/next"), append(wantBy, "last"); !slices.Equal(log, want) || !slices.Equal(by, wantBy) {
		t.Fatalf("handled %q by %q, want %q by %q", log, by, want, wantBy)
	}
	// The drop notice is a request the last router waited for; the typing
	// stop after it is published, so it may still be on its way.
	testsvc.WaitFor(t, 5*time.Second, "the drop notice and typing stop at the phone", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(phone) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if len(phone) != 2 {
		t.Fatalf("the phone got %+v, want the drop notice and typing stop", phone)
	}
	msg, typing := phone[0], phone[1]
	wantText := "This message could not be handled (the agent failed on it 3 times) and was dropped."
	if msg.Op != wire.OpMessage || !msg.Final || msg.Edit || msg.Text != wantText || msg.ID == "" {
		t.Errorf("the phone got %+v, want a final message %q", msg, wantText)
	}
	if typing.Op != wire.OpTyping || !typing.Stop {
		t.Errorf("then %+v, want typing stop (avatar idle)", typing)
	}
}
