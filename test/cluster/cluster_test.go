//go:build unix

package cluster

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"

	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// cluster is one test's gateway: edges and a router, as processes, on a NATS
// of their own and a Redis prefix of their own.
type cluster struct {
	t                               *testing.T
	opts                            options
	nats, redis, prefix             string
	redisMode                       string   // REDIS_MODE; empty: single
	natsServers                     []string // with a NATS cluster: one URL per server (see natsFor)
	natsPrefix                      string   // NATS_PREFIX: the NATS cluster is shared by the tests of a run
	token, deliverToken, agentToken string

	mu        sync.Mutex
	edges     map[string]*edgeProc
	router    *testsvc.Proc
	routerURL string // http://host:port

	// probe sends outputs the way the router does (see waitReachable).
	probe *dispatch.Dispatcher
	// routerLink is the router's way to NATS with options.routerBusDelay.
	routerLink *link
}

// edgeProc is a running edge.
type edgeProc struct {
	*testsvc.Proc
	url string // ws://host:port/ws
}

// options of a cluster.
type options struct {
	// promptTTL is MOBILE_PROMPT_TTL; the default (300 s) when empty.
	promptTTL string
	// routerBusDelay, when set, puts the router behind a link to NATS that
	// delays what it sends (see slowLink).
	routerBusDelay time.Duration
	// routerEnv is added to the router's settings; env to every
	// process's.
	routerEnv []string
	env       []string
	// edgeBin and routerBin are the binaries newCluster starts; empty:
	// this build's (bins). startEdge always starts this build's.
	edgeBin, routerBin string
}

// newCluster starts edges A and B and the router and returns once all of
// them listen. Everything stops when the test ends.
func newCluster(t *testing.T, o options) *cluster {
	t.Helper()
	edges := []string{"A", "B"}
	c := &cluster{
		t:            t,
		opts:         o,
		redis:        redisURL(t),
		prefix:       "hermes-cluster-test:" + testsvc.RandomHex(6) + ":",
		token:        "app-" + testsvc.RandomHex(12),
		deliverToken: "cron-" + testsvc.RandomHex(12),
		agentToken:   "agent-" + testsvc.RandomHex(12),
		edges:        make(map[string]*edgeProc),
	}
	if b := backends(); b.redisURL != "" {
		// Run by TestClusteredBackends: its Redis Cluster or Sentinel and
		// its NATS cluster, fresh for the run.
		c.redis, c.redisMode, c.natsServers = b.redisURL, b.redisMode, b.natsURLs
		c.nats = c.natsServers[0]
		c.natsPrefix = b.natsPrefix + "t" + testsvc.RandomHex(6) + "."
	} else {
		c.nats = natsURL(t)
		dropRedisKeys(t, c.redis, c.prefix)
	}
	if o.routerBusDelay > 0 {
		c.routerLink = slowLink(t, strings.TrimPrefix(c.nats, "nats://"), o.routerBusDelay)
	}

	type started struct {
		name string
		p    *testsvc.Proc
		url  string
		err  error
	}
	results := make(chan started)
	launchOne := func(name, bin, msg string, env []string) {
		p, url, err := testsvc.Launch(name, bin, nil, env, func(s string) { t.Log(s) }, logMsg(msg))
		results <- started{name, p, url, err}
	}
	for _, name := range edges {
		go launchOne("edge-"+name, cmp.Or(o.edgeBin, bins.edge), "gateway listening", append(c.edgeEnv(), c.natsFor("edge-"+name)...))
	}
	go launchOne("router", cmp.Or(o.routerBin, bins.router), "router listening", append(c.routerEnv(), c.natsFor("router")...))
	var errs []error
	for range len(edges) + 1 {
		r := <-results
		if r.p != nil {
			t.Cleanup(func() { r.p.Stop(t.Logf) })
		}
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.name == "router":
			c.router, c.routerURL = r.p, strings.TrimSuffix(r.url, "/")
		default:
			c.edges[strings.TrimPrefix(r.name, "edge-")] = &edgeProc{r.p, r.url}
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	c.startProbe(t)
	return c
}

// startProbe connects the test to the cluster's store and bus, as a router.
func (c *cluster) startProbe(t *testing.T) {
	t.Helper()
	st, err := redisstore.New(testCtx(t), redisstore.Options{URL: c.redis, Mode: c.redisMode, Prefix: c.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	b, err := natsbus.Connect(c.nats, natsbus.Options{Name: "cluster-test", SubjectPrefix: c.natsPrefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	c.probe = &dispatch.Dispatcher{Owners: st, Bus: b, Timeout: time.Second}
}

// waitReachable waits until an output for dev, stamped with its current
// epoch as the router stamps it, is acknowledged by the edge that holds dev:
// that edge's subscription has reached NATS. The output is of an op no edge
// knows, which the edge acknowledges without writing anything to the phone.
//
// A phone can get ready before that (see TestDeliverRightAfterReady): the
// tests that are not about it wait here so that they test what they say.
func (c *cluster) waitReachable(t testing.TB, dev string) {
	t.Helper()
	var o dispatch.Outcome
	var err error
	if !testsvc.Eventually(10*time.Second, func() bool {
		o, err = c.probe.Send(testCtx(t), wire.Output{Op: "probe", Device: dev})
		return err == nil && o == dispatch.Delivered
	}) {
		t.Fatalf("%s: the edge holding it did not answer a delivery within 10 s: %s, %v", dev, o, err)
	}
}

func (c *cluster) common() []string {
	ttl := c.opts.promptTTL
	if ttl == "" {
		ttl = "300"
	}
	return []string{
		"NATS_URL=" + c.nats,
		"REDIS_URL=" + c.redis,
		"REDIS_PREFIX=" + c.prefix,
		"REDIS_MODE=" + cmp.Or(c.redisMode, "single"),
		"NATS_PREFIX=" + c.natsPrefix,
		"MOBILE_DELIVER_TOKENS=" + c.deliverToken,
		"MOBILE_PROMPT_TTL=" + ttl,
		"MOBILE_LOG_LEVEL=debug",
		"MOBILE_ADMIN_LISTEN=127.0.0.1:0",
	}
}

// natsFor is the NATS_URL setting that puts process name on a server of
// its own when the bus is a NATS cluster (edge A on the first server, B on
// the second, the router on the third, others by their name's length), so
// that what crosses nodes crosses the cluster's routes too. Nothing
// without one.
func (c *cluster) natsFor(name string) []string {
	if len(c.natsServers) == 0 || c.routerLink != nil {
		return nil
	}
	i := len(name)
	switch name {
	case "edge-A":
		i = 0
	case "edge-B":
		i = 1
	case "router":
		i = 2
	}
	return []string{"NATS_URL=" + c.natsServers[i%len(c.natsServers)]}
}

func (c *cluster) edgeEnv() []string {
	return append(append(c.common(),
		"MOBILE_LISTEN=127.0.0.1:0",
		"MOBILE_TOKEN="+c.token,
		"MOBILE_ROUTER=off",
	), c.opts.env...)
}

func (c *cluster) routerEnv() []string {
	env := append(c.common(),
		"MOBILE_ROUTER_LISTEN=127.0.0.1:0",
		"MOBILE_AGENT_TOKENS="+c.agentToken,
		"AGENT=demo",
	)
	if c.routerLink != nil {
		env = append(env, "NATS_URL="+c.routerLink.url())
	}
	return append(append(env, c.opts.env...), c.opts.routerEnv...)
}

// startEdge starts another edge while the test runs; env is added to (and
// overrides) the usual settings.
func (c *cluster) startEdge(t *testing.T, name string, env ...string) *edgeProc {
	t.Helper()
	env = append(append(c.edgeEnv(), c.natsFor("edge-"+name)...), env...)
	p, url := testsvc.StartProc(t, "edge-"+name, bins.edge, nil, env, logMsg("gateway listening"))
	e := &edgeProc{p, url}
	c.mu.Lock()
	c.edges[name] = e
	c.mu.Unlock()
	return e
}

// edge returns the edge called name.
func (c *cluster) edge(name string) *edgeProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.edges[name]
	if e == nil {
		c.t.Fatalf("no edge %q", name)
	}
	return e
}

// logMsg matches a JSON log line whose msg is want and returns its url.
func logMsg(want string) func(string) (string, bool) {
	return func(line string) (string, bool) {
		var rec struct {
			Msg string `json:"msg"`
			URL string `json:"url"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != want {
			return "", false
		}
		return rec.URL, true
	}
}

// ---- phones ----

// testCtx ends with the test or after 30 s.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// within is a context that ends after d (or with the test).
func within(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// dial opens a WebSocket to the edge, closed (without a close frame) when the
// test ends.
func (c *cluster) dial(t testing.TB, edge string) *client.Conn {
	t.Helper()
	conn, err := client.Dial(testCtx(t), c.edge(edge).url, client.Options{Timeout: 5 * time.Second, WriteTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("dial edge %s: %v", edge, err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	return conn
}

func device(id string) protocol.Device {
	return protocol.Device{ID: id, Name: "Phone " + id, Platform: "android", AppVersion: "1.0.0"}
}

var user = protocol.User{ID: "u-1", Name: "Tester"}

// connect dials the edge, says hello as dev and waits until deliveries can
// reach it (waitReachable).
func (c *cluster) connect(t testing.TB, edge, dev string) *client.Conn {
	t.Helper()
	conn := c.hello(t, edge, dev)
	c.waitReachable(t, dev)
	return conn
}

// hello dials the edge and says hello as dev.
func (c *cluster) hello(t testing.TB, edge, dev string) *client.Conn {
	t.Helper()
	conn := c.dial(t, edge)
	ready, err := conn.Hello(testCtx(t), c.token, device(dev), user)
	if err != nil {
		t.Fatalf("hello as %s on edge %s: %v", dev, edge, err)
	}
	if got := ready.Str("session"); got != protocol.Session(dev) {
		t.Fatalf("ready.session = %q, want %q", got, protocol.Session(dev))
	}
	return conn
}

// newDevice is a device id no other test uses.
func newDevice(name string) string { return name + "-" + testsvc.RandomHex(4) }

// ---- the router's HTTP API ----

// post sends body as JSON with a bearer token and returns the status and
// the decoded answer.
func (c *cluster) post(t testing.TB, path, token string, body any) (int, map[string]any) {
	t.Helper()
	code, out, err := c.tryPost(testCtx(t), path, token, body)
	if err != nil {
		t.Fatal(err)
	}
	return code, out
}

// tryPost is post for goroutines other than the test's.
func (c *cluster) tryPost(ctx context.Context, path, token string, body any) (int, map[string]any, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.routerURL+path, bytes.NewReader(data))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("POST %s: reading the answer: %w", path, err)
	}
	var out map[string]any
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			return resp.StatusCode, nil, fmt.Errorf("POST %s: answer %d is not a JSON object: %q", path, resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, out, nil
}

// deliver asks the router to deliver text to dev.
func (c *cluster) deliver(t testing.TB, dev, id, text string) (int, map[string]any) {
	t.Helper()
	return c.post(t, "/v1/deliver", c.deliverToken, map[string]any{"target": protocol.Session(dev), "id": id, "text": text})
}

// mustDeliver delivers and requires 200 {"ok":true}.
func (c *cluster) mustDeliver(t testing.TB, dev, id, text string) {
	t.Helper()
	if code, body := c.deliver(t, dev, id, text); code != http.StatusOK || body["ok"] != true {
		t.Fatalf("deliver %s to %s: %d %v, want 200 {\"ok\":true}", id, dev, code, body)
	}
}

// agentMessage is the body of POST /v1/sessions/<session>/messages.
type agentMessage struct {
	ID    string `json:"id,omitempty"`
	Text  string `json:"text"`
	Edit  bool   `json:"edit,omitempty"`
	Final bool   `json:"final"`
}

// say sends an agent message to dev through the router's agent API and
// returns the message id the router reports.
func (c *cluster) say(t testing.TB, dev string, m agentMessage) string {
	t.Helper()
	code, body := c.post(t, "/v1/sessions/"+protocol.Session(dev)+"/messages", c.agentToken, m)
	if code != http.StatusOK || body["ok"] != true {
		t.Fatalf("agent message %+v to %s: %d %v, want 200 {\"ok\":true,…}", m, dev, code, body)
	}
	id, _ := body["id"].(string)
	if m.ID != "" && id != m.ID {
		t.Fatalf("agent message %+v: the router answered id %q", m, id)
	}
	return id
}

// ---- reading frames ----

// readUntil reads frames until stop accepts one and returns all of them,
// that one last. The test fails if the connection ends or 15 s pass first.
func readUntil(t testing.TB, conn *client.Conn, what string, stop func(client.Frame) bool) []client.Frame {
	t.Helper()
	ctx := within(t, 15*time.Second)
	var got []client.Frame
	for {
		f, err := conn.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v; before it came: %v", what, err, got)
		}
		if ci := f.Close(); ci != nil {
			t.Fatalf("waiting for %s: the server closed the connection (%s); before it came: %v", what, ci, got)
		}
		got = append(got, f)
		if stop(f) {
			return got
		}
	}
}

// finalText accepts the final frame of an agent message whose complete text
// is text (a short one, so its final frame carries all of it).
func finalText(text string) func(client.Frame) bool {
	return func(f client.Frame) bool {
		return f.T() == protocol.TypeMessage && f.Bool("final") && f.Str("text") == text
	}
}

// message is an agent message put together from its frames.
type message struct {
	id, text string
	frames   int
	final    bool
}

// messages puts the message frames among fs together, in the order the
// messages began: an edit whose chunk.index is 0 starts the text anew.
func messages(fs []client.Frame) []message {
	var out []message
	at := make(map[string]int)
	for _, f := range fs {
		if f.T() != protocol.TypeMessage {
			continue
		}
		id := f.Str("id")
		i, ok := at[id]
		if !ok {
			i = len(out)
			at[id] = i
			out = append(out, message{id: id})
		}
		m := &out[i]
		if f.Bool("edit") && f.Map("chunk").Int("index") == 0 {
			m.text = ""
		}
		m.text += f.Str("text")
		m.frames++
		m.final = m.final || f.Bool("final")
	}
	return out
}

// texts lists the texts of ms.
func texts(ms []message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.text
	}
	return out
}

// ofType returns the frames of type typ.
func ofType(fs []client.Frame, typ string) []client.Frame {
	var out []client.Frame
	for _, f := range fs {
		if f.T() == typ {
			out = append(out, f)
		}
	}
	return out
}

// expectClose waits up to d for the server's close frame and requires code.
// It returns how long it took.
func expectClose(t testing.TB, conn *client.Conn, d time.Duration, code int) time.Duration {
	t.Helper()
	start := time.Now()
	ci, err := conn.ExpectClose(within(t, d))
	if err != nil {
		t.Fatalf("no close frame within %v: %v", d, err)
	}
	if ci.Code != code {
		t.Fatalf("close %s, want code %d", ci, code)
	}
	return time.Since(start)
}

// pingBarrier sends a ping and reads up to its pong: the edge handles a
// connection's frames in order, so everything sent before was handled. It
// returns the frames that came before the pong.
func pingBarrier(t testing.TB, conn *client.Conn) []client.Frame {
	t.Helper()
	ts := testsvc.RandomHex(4)
	if err := conn.Ping(ts); err != nil {
		t.Fatal(err)
	}
	fs := readUntil(t, conn, "pong "+ts, func(f client.Frame) bool {
		return f.T() == protocol.TypePong && f.Str("ts") == ts
	})
	return fs[:len(fs)-1]
}

// errorsIn returns the error frames among fs.
func errorsIn(fs []client.Frame) []*client.ServerError {
	var out []*client.ServerError
	for _, f := range fs {
		if e := client.AsServerError(f); e != nil {
			out = append(out, e)
		}
	}
	return out
}

func describe(fs []client.Frame) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "\n  %s", f)
	}
	return b.String()
}
