//go:build unix

package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
)

// Shape of TestGracefulDrain.
const (
	drainPhones = 200
	drainWindow = 2 * time.Second
	// drainGrace is how long past its window the edge may take to exit:
	// the edge's own grace (10 s, services/edge) and a margin.
	drainGrace = 15 * time.Second
	// drainPrompt bounds how soon after SIGTERM /readyz fails and the
	// listener refuses (generous: the machine may be busy).
	drainPrompt = drainWindow / 2
	// drainCronWorkers post deliveries to the router side by side.
	drainCronWorkers = 4
)

// TestGracefulDrain: edge D holds 200 phones that talk to the demo agent
// while cron delivers to them through the router. D gets SIGTERM with
// MOBILE_DRAIN_WINDOW=2: its /readyz turns 503 at once, its listener
// refuses new connections, every phone gets close 1001, the closes are
// spread over the window (the first to the last at least half of it; how
// they fall within it is TestDrainSchedule's), and D exits 0 within the
// window and its grace. The phones reconnect to edge B, resending what was
// not answered (as the protocol's idempotency rules allow), and then every
// message a phone sent is answered by exactly one message of the agent, and
// every delivery the router acknowledged with 200 arrives; an answer or a
// delivery written to D's socket while its phone was already on B arrives
// again from B, with the same id (the app replaces a message by id).
func TestGracefulDrain(t *testing.T) {
	c := newCluster(t, options{})
	d, admin := startAdminEdge(t, c, "D", fmt.Sprintf("MOBILE_DRAIN_WINDOW=%d", int(drainWindow/time.Second)), "MOBILE_LOG_LEVEL=info")
	if code := httpStatus(admin + "/readyz"); code != http.StatusOK {
		t.Fatalf("D's /readyz before the drain: %d, want 200", code)
	}

	phones := make([]*drainPhone, drainPhones)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range phones {
		p := &drainPhone{c: c, dev: newDevice(fmt.Sprintf("drain-%03d", i)), finals: make(map[string]int), delivered: make(map[string]int), texts: make(map[string]string)}
		phones[i] = p
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := p.connect("D"); err != nil {
				t.Errorf("%s: %v", p.dev, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, p := range phones {
		c.waitReachable(t, p.dev)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var readers, senders sync.WaitGroup
	for _, p := range phones {
		readers.Go(func() { p.read(ctx) })
		senders.Go(func() { p.send(ctx) })
	}
	stopCron := make(chan struct{})
	var cron sync.WaitGroup
	var codesMu sync.Mutex
	cronCodes := make(map[int]int)
	for w := range drainCronWorkers {
		cron.Go(func() {
			codes := deliverWhileRunning(c, phones, stopCron, w)
			codesMu.Lock()
			defer codesMu.Unlock()
			for code, n := range codes {
				cronCodes[code] += n
			}
		})
	}

	// Traffic flows through D: every phone has had an answer there.
	waitPhones(t, phones, "an answer on D", func(p *drainPhone) bool {
		edge, answers := p.progress()
		return edge == "D" && answers > 0
	})
	sigterm := time.Now()
	d.Signal(t, syscall.SIGTERM)

	// Out of the pool at once: /readyz and the listener.
	for {
		code := httpStatus(admin + "/readyz")
		if code == http.StatusServiceUnavailable {
			break
		}
		if time.Since(sigterm) > drainPrompt {
			t.Fatalf("D's /readyz is %d %v after SIGTERM, want 503", code, time.Since(sigterm))
		}
		time.Sleep(2 * time.Millisecond) // poll interval: the loop waits for its condition
	}
	dHost := hostOf(t, d.url)
	for {
		nc, err := net.DialTimeout("tcp", dHost, time.Second)
		if err != nil {
			break
		}
		nc.Close()
		if time.Since(sigterm) > drainPrompt {
			t.Fatalf("D still accepts connections %v after SIGTERM", time.Since(sigterm))
		}
		time.Sleep(2 * time.Millisecond) // poll interval: the loop waits for its condition
	}

	select {
	case <-d.Exited():
		if d.Err() != nil {
			t.Fatalf("D exited with %v after SIGTERM, want status 0", d.Err())
		}
		t.Logf("D exited %v after SIGTERM", time.Since(sigterm).Round(time.Millisecond))
	case <-time.After(drainWindow + drainGrace):
		t.Fatalf("D still runs %v after SIGTERM (window %v)", drainWindow+drainGrace, drainWindow)
	}

	// Traffic flows through B: every phone is there and has been answered
	// there.
	atExit := make(map[*drainPhone]int)
	for _, p := range phones {
		_, atExit[p] = p.progress()
	}
	waitPhones(t, phones, "an answer on B", func(p *drainPhone) bool {
		edge, answers := p.progress()
		return edge == "B" && answers > atExit[p]
	})
	close(stopCron)
	cron.Wait()
	for _, p := range phones {
		p.stopSending()
	}
	senders.Wait()

	// Every phone gets an answer to everything it sent; what was never
	// taken is sent again (same id), as an app does.
	deadline := time.Now().Add(40 * time.Second)
	for _, p := range phones {
		for !p.allAnswered() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: unanswered after 40 s: %v (%s)", p.dev, p.unanswered(), outboxOf(c, p.dev))
			}
			p.resendUnanswered(2 * time.Second)
			time.Sleep(50 * time.Millisecond) // the app's resend pace, not a wait for a state
		}
	}
	// Acknowledged deliveries: a marker delivered after all of them comes
	// behind them (the router delivers to a device in order).
	for _, p := range phones {
		c.mustDeliver(t, p.dev, "marker", "marker")
	}
	waitPhones(t, phones, "marker", func(p *drainPhone) bool { return p.count("marker") > 0 })
	cancel()
	readers.Wait()

	t.Logf("router deliver answers during the test: %v", cronCodes)
	checkDrainCloses(t, phones, sigterm)
	var sent, resent, acked, again int
	for _, p := range phones {
		p.mu.Lock()
		sent += len(p.sent)
		resent += p.resent
		acked += len(p.acked)
		if p.edge != "B" {
			t.Errorf("%s ended on edge %s, want B", p.dev, p.edge)
		}
		// Answered once by the agent: one message id. The same message may
		// arrive twice (written to the socket the phone was leaving, then
		// sent to its new owner: the app replaces a message by id).
		for _, id := range p.sent {
			text := p.texts[id]
			if n, ids := p.finals[text], len(p.answerIDs[text]); n == 0 || ids != 1 {
				t.Errorf("%s: message %s answered %d times as %d messages, want one message", p.dev, id, n, ids)
			}
			again += max(0, p.finals[text]-1)
		}
		for text, n := range p.finals {
			if !p.wasSent(text) {
				t.Errorf("%s: an answer %q (%d) to nothing it sent", p.dev, text, n)
			}
		}
		for _, id := range p.acked {
			if n := p.delivered[id]; n == 0 {
				t.Errorf("%s: delivery %s acknowledged with 200, never received", p.dev, id)
			}
		}
		for _, n := range p.delivered {
			again += max(0, n-1)
		}
		if p.readErr != nil {
			t.Errorf("%s: %v", p.dev, p.readErr)
		}
		p.mu.Unlock()
	}
	t.Logf("%d phones sent %d messages (%d resent after the close); %d deliveries acknowledged; %d messages arrived a second time", len(phones), sent, resent, acked, again)
	if sent < 2*len(phones) || acked < len(phones)/2 {
		t.Fatalf("too little traffic to judge: %d messages, %d deliveries", sent, acked)
	}
}

// waitPhones waits until cond holds for every phone.
func waitPhones(t *testing.T, phones []*drainPhone, what string, cond func(*drainPhone) bool) {
	t.Helper()
	deadline := time.Now().Add(testsvc.Slack(60 * time.Second))
	for _, p := range phones {
		testsvc.WaitFor(t, time.Until(deadline), p.dev+": "+what, func() bool { return cond(p) })
	}
}

// checkDrainCloses requires close 1001 on every phone, the first close
// near the start of the window and the last near its end. How the closes
// fall within the window is drainSchedule's, tested in pkg/edge with its
// own draws; here a busy machine may delay when a phone sees its close, so
// only the spread's lower bound is asserted (a delay can only make the
// last close later).
func checkDrainCloses(t *testing.T, phones []*drainPhone, sigterm time.Time) {
	t.Helper()
	var first, last time.Duration = -1, 0
	for _, p := range phones {
		if p.closeCode != 1001 {
			t.Errorf("%s: closed with %d, want 1001", p.dev, p.closeCode)
			continue
		}
		at := p.closedAt.Sub(sigterm)
		if first < 0 || at < first {
			first = at
		}
		last = max(last, at)
	}
	t.Logf("closes from %v to %v after SIGTERM", first.Round(time.Millisecond), last.Round(time.Millisecond))
	if last-first < drainWindow/2 {
		t.Errorf("closes from %v to %v: spread over less than half the %v window", first, last, drainWindow)
	}
	if last > drainWindow+drainGrace {
		t.Errorf("the last close came %v after SIGTERM", last)
	}
}

// startAdminEdge starts another edge and returns it with the URL of its
// admin port (its "admin listening" log line).
func startAdminEdge(t *testing.T, c *cluster, name string, env ...string) (*edgeProc, string) {
	t.Helper()
	var admin string
	ready := func(line string) (string, bool) {
		if u, ok := logMsg("admin listening")(line); ok {
			admin = u // before "gateway listening", on the same goroutine
			return "", false
		}
		return logMsg("gateway listening")(line)
	}
	p, wsURL := testsvc.StartProc(t, "edge-"+name, bins.edge, nil, append(c.edgeEnv(), env...), ready)
	if admin == "" {
		t.Fatalf("edge %s logged no admin url", name)
	}
	e := &edgeProc{p, wsURL}
	c.mu.Lock()
	c.edges[name] = e
	c.mu.Unlock()
	return e, admin
}

// outboxOf describes what the device's outbox holds, for a failure message.
func outboxOf(c *cluster, dev string) string {
	rdb, err := redisstore.NewClient(c.redisMode, c.redis, 0)
	if err != nil {
		return err.Error()
	}
	defer rdb.Close()
	items, err := rdb.LRange(context.Background(), c.prefix+"outbox:{"+dev+"}", 0, -1).Result()
	if err != nil {
		return "outbox: " + err.Error()
	}
	return fmt.Sprintf("outbox holds %d: %v", len(items), items)
}

func httpStatus(u string) int {
	hc := http.Client{Timeout: time.Second}
	resp, err := hc.Get(u)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func hostOf(t *testing.T, wsURL string) string {
	t.Helper()
	u, err := url.Parse(wsURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// deliverWhileRunning posts deliveries to random phones until stop and
// returns how many of each HTTP status came back. Each phone records the
// ids acknowledged with 200.
func deliverWhileRunning(c *cluster, phones []*drainPhone, stop chan struct{}, worker int) map[int]int {
	codes := make(map[int]int)
	for n := 0; ; n++ {
		select {
		case <-stop:
			return codes
		case <-time.After(10 * time.Millisecond):
		}
		p := phones[rand.N(len(phones))]
		id := fmt.Sprintf("cron-%d-%d", worker, n)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		code, _, err := c.tryPost(ctx, "/v1/deliver", c.deliverToken, map[string]any{"target": protocol.Session(p.dev), "id": id, "text": "delivery " + id})
		cancel()
		if err != nil {
			code = -1
		}
		codes[code]++
		if code == http.StatusOK {
			p.mu.Lock()
			p.acked = append(p.acked, id)
			p.mu.Unlock()
		}
	}
}

// drainPhone is a phone of TestGracefulDrain: it sends texts, counts the
// final answers and the deliveries, and reconnects to edge B when its edge
// closes with 1001, sending again what was not answered.
type drainPhone struct {
	c   *cluster
	dev string

	mu         sync.Mutex
	conn       *client.Conn
	edge       string
	sent       []string                   // ids, in order
	texts      map[string]string          // id → text
	finals     map[string]int             // answer text → final frames seen
	answerIDs  map[string]map[string]bool // answer text → the message ids it came with
	delivered  map[string]int             // delivery id → frames seen
	acked      []string                   // delivery ids the router answered 200
	resent     int
	stopped    bool
	lastResend time.Time
	closedAt   time.Time
	closeCode  int
	readErr    error
}

func (p *drainPhone) connect(edge string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, p.c.edge(edge).url, client.Options{Timeout: 5 * time.Second, WriteTimeout: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("dial edge %s: %w", edge, err)
	}
	if _, err := conn.Hello(ctx, p.c.token, device(p.dev), user); err != nil {
		conn.CloseNow()
		return fmt.Errorf("hello on edge %s: %w", edge, err)
	}
	p.mu.Lock()
	old := p.conn
	p.conn, p.edge = conn, edge
	p.mu.Unlock()
	if old != nil {
		old.CloseNow()
	}
	p.c.t.Cleanup(func() { conn.CloseNow() })
	return nil
}

// send sends a text every 0.4 to 1.2 s until stopSending.
func (p *drainPhone) send(ctx context.Context) {
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(400+rand.N(800)) * time.Millisecond):
		}
		id := fmt.Sprintf("m-%d", k)
		text := p.dev + " says " + id
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return
		}
		p.sent = append(p.sent, id)
		p.texts[id] = text
		conn := p.conn
		p.mu.Unlock()
		conn.Text(id, text) // on a closing socket it fails; the reconnect resends it
	}
}

func (p *drainPhone) stopSending() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
}

// read consumes frames until ctx ends, reconnecting to B after a close.
func (p *drainPhone) read(ctx context.Context) {
	for {
		p.mu.Lock()
		conn := p.conn
		p.mu.Unlock()
		f, err := conn.Next(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil && f.IsZero() {
			p.fail(fmt.Errorf("connection ended without a close frame: %w", err))
			return
		}
		if ci := f.Close(); ci != nil {
			p.mu.Lock()
			first := p.closeCode == 0
			if first {
				p.closeCode, p.closedAt = ci.Code, time.Now()
			}
			p.mu.Unlock()
			if !first {
				p.fail(fmt.Errorf("a second close: %s", ci))
				return
			}
			if err := p.connect("B"); err != nil {
				p.fail(err)
				return
			}
			p.resendUnanswered(0)
			continue
		}
		if f.T() != protocol.TypeMessage || !f.Bool("final") {
			continue
		}
		p.mu.Lock()
		if id := f.Str("id"); strings.HasPrefix(id, "cron-") || id == "marker" {
			p.delivered[id]++
		} else if text, ok := strings.CutPrefix(f.Str("text"), "You said: "); ok {
			p.finals[text]++
			if p.answerIDs == nil {
				p.answerIDs = make(map[string]map[string]bool)
			}
			if p.answerIDs[text] == nil {
				p.answerIDs[text] = make(map[string]bool)
			}
			p.answerIDs[text][f.Str("id")] = true
		}
		p.mu.Unlock()
	}
}

func (p *drainPhone) fail(err error) {
	p.mu.Lock()
	if p.readErr == nil {
		p.readErr = err
	}
	p.mu.Unlock()
}

// unanswered lists the ids sent without a final answer yet.
func (p *drainPhone) unanswered() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, id := range p.sent {
		if p.finals[p.texts[id]] == 0 {
			out = append(out, id)
		}
	}
	return out
}

func (p *drainPhone) allAnswered() bool { return len(p.unanswered()) == 0 }

// resendUnanswered sends the unanswered texts again, at most once per
// every: a repeat of one that was taken is dropped by the gateway's dedup.
func (p *drainPhone) resendUnanswered(every time.Duration) {
	ids := p.unanswered()
	p.mu.Lock()
	if len(ids) == 0 || time.Since(p.lastResend) < every {
		p.mu.Unlock()
		return
	}
	p.lastResend = time.Now()
	p.resent += len(ids)
	conn := p.conn
	texts := make([]string, len(ids))
	for i, id := range ids {
		texts[i] = p.texts[id]
	}
	p.mu.Unlock()
	for i, id := range ids {
		conn.Text(id, texts[i])
	}
}

// progress reports the edge the phone is on and how many answers it has.
func (p *drainPhone) progress() (edge string, answers int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.finals {
		answers += n
	}
	return p.edge, answers
}

func (p *drainPhone) count(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delivered[id]
}

// wasSent reports whether text is one the phone sent; p.mu is held.
func (p *drainPhone) wasSent(text string) bool {
	for _, t := range p.texts {
		if t == text {
			return true
		}
	}
	return false
}

// TestDrainSecondSignal: a second SIGTERM during a long drain window closes
// the remaining sockets (still with 1001) and the edge exits 0 at once.
func TestDrainSecondSignal(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	e, _ := startAdminEdge(t, c, "E", "MOBILE_DRAIN_WINDOW=60")
	var conns []*client.Conn
	for i := range 3 {
		conns = append(conns, c.connect(t, "E", newDevice(fmt.Sprintf("tel-%d", i))))
	}
	draining := e.Watch(logMsg("draining"))
	e.Signal(t, syscall.SIGTERM)
	select {
	case <-draining:
	case <-time.After(10 * time.Second):
		t.Fatal("no draining log line after SIGTERM")
	}
	second := time.Now()
	e.Signal(t, syscall.SIGTERM)
	select {
	case <-e.Exited():
		if e.Err() != nil {
			t.Fatalf("E exited with %v after the second SIGTERM, want status 0", e.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("E still runs 5 s after the second SIGTERM (window 60 s)")
	}
	for _, conn := range conns {
		expectClose(t, conn, 5*time.Second, 1001)
	}
	t.Logf("E exited %v after the second SIGTERM", time.Since(second).Round(time.Millisecond))
}
