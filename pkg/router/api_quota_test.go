package router_test

// Owners' quotas counted in the store, across routers: two routers (two
// APIs) on one Redis, each owner's reads counted once for the whole
// cluster.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// quotaTenants is acme with 3 event reads and beta with 1.
var quotaTenants = "tenants:\n  - id: acme\n    keys:\n" + acmeKeysAll + `    quota: {event_reads: 3}
  - id: beta
    keys:
      - {id: app, kind: app, secret: beta-app-secret}
      - {id: hermes, kind: agent, secret: beta-agent-secret}
      - {id: cron, kind: deliver, secret: beta-cron-secret}
    quota: {event_reads: 1}
`

// secondRouter starts another router and its API on e's Redis and key
// prefix, reading the owners of reg, with clk as its and its store's
// clock. It serves reads only: its NATS subjects are its own.
func secondRouter(t *testing.T, e *env, reg *tenant.Registry, clk clock.Clock) (*env, *redisstore.Store) {
	t.Helper()
	st, err := redisstore.New(t.Context(), redisstore.Options{URL: e.redisURL, Prefix: e.redisPrefix, Clock: clk})
	if err != nil {
		t.Fatalf("redisstore: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	log := testLogger(t, "router-2")
	b, err := natsbus.Connect(testsvc.NATSURL(t), natsbus.Options{Logger: log, Name: "router-2", SubjectPrefix: "rt" + testsvc.RandomHex(3) + "."})
	if err != nil {
		t.Fatalf("natsbus: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	r := router.New(router.Config{Clock: clk}, st, b, agent.NewLink(st, 1000), log)
	if err := r.Start(); err != nil {
		t.Fatalf("router: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return serve(t, &env{router: r, store: st}, apiConfig(func(c *router.APIConfig) { c.Tenants = reg })), st
}

func bearerHeader(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

// wantReadRefused checks that a read of token on e is 429
// too_many_streams with Retry-After.
func wantReadRefused(t *testing.T, e *env, token string) {
	t.Helper()
	r := e.call(t, "GET", "/v1/events?wait=0", token, nil)
	wantError(t, r, http.StatusTooManyRequests, "too_many_streams")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("429 too_many_streams without Retry-After")
	}
}

// TestOwnerEventReadsAcrossRouters: an owner's event_reads quota (3) holds
// across two routers: exactly 3 open streams, on either, are served; the
// 4th read is 429 on each router while the other owner's read is served;
// one closed lets the next in. A stream renews its place while it is
// open: past the lease's ttl by its router's clock it is still counted.
func TestOwnerEventReadsAcrossRouters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeTenants(t, path, quotaTenants)
	reg := openTenants(t, path)
	e1 := startClusterOf(t, apiConfig(func(c *router.APIConfig) { c.Tenants = reg }), reg)
	clk := clock.NewFake(time.Now())
	e2, st2 := secondRouter(t, e1, reg, clk)
	acmeReads := tenant.QuotaKey("acme", tenant.QuotaEventReads)
	count := func() int {
		t.Helper()
		n, err := e1.store.LeaseCount(t.Context(), acmeReads)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	a1 := e1.openStream(t, "", bearerHeader(acmeAgent))
	e1.openStream(t, "", bearerHeader(acmeAgent))
	e2.openStream(t, "", bearerHeader(acmeAgent))
	if n := count(); n != 3 {
		t.Fatalf("acme's reads in the store: %d, want 3", n)
	}
	wantReadRefused(t, e1, acmeAgent)
	wantReadRefused(t, e2, acmeAgent)
	// The other owner is served on both, up to its own quota.
	b1 := e1.openStream(t, "", bearerHeader(betaAgent))
	wantReadRefused(t, e2, betaAgent)
	b1.resp.Body.Close()
	testsvc.WaitFor(t, 10*time.Second, "beta served on router 2 once its stream closed", func() bool {
		return e2.call(t, "GET", "/v1/events?wait=0", betaAgent, nil).status == http.StatusOK
	})
	// The legacy owner's token keeps its bound per router.
	wantOK200(t, e2.call(t, "GET", "/v1/events?wait=0", agentToken, nil))

	// One closed lets the next in, on the other router.
	a1.resp.Body.Close()
	testsvc.WaitFor(t, 10*time.Second, "acme's closed stream released", func() bool { return count() == 2 })
	s := e2.openStream(t, "", bearerHeader(acmeAgent))
	wantReadRefused(t, e1, acmeAgent)

	// Renewal: the stream just opened on router 2 outlives its first
	// lease's ttl by router 2's clock, renewed at its keep-alive.
	c2 := func() int {
		t.Helper()
		n, err := st2.LeaseCount(t.Context(), acmeReads)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	clk.Advance(50 * time.Second)
	drainComments(s)
	for range 2 { // a whole turn of the stream after the advance
		select {
		case <-s.comments:
		case <-time.After(10 * time.Second):
			t.Fatal("no keep-alive on the stream within 10 s")
		}
	}
	clk.Advance(20 * time.Second) // 70 s after the stream opened
	// Router 2's two open streams, both renewed; router 1's (by its own
	// clock, behind) lapsed by this one.
	if n := c2(); n != 2 {
		t.Fatalf("router 2's open streams at 70 s: %d reads counted, want 2", n)
	}
}

// drainComments empties what s has read of comments so far.
func drainComments(s *sseStream) {
	for {
		select {
		case <-s.comments:
		default:
			return
		}
	}
}

func wantOK200(t *testing.T, r response) {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", r.status, r.body)
	}
}

// TestOwnerOutboxQuota: acme (outbox_mib 1) floods its sleeping devices
// with cron deliveries far past its quota while beta's phone sleeps with
// one queued cron message: acme's outboxes keep at most 1 MiB, its own
// newest, and beta's message is delivered when beta's phone wakes.
func TestOwnerOutboxQuota(t *testing.T) {
	file := "tenants:\n  - id: acme\n    keys:\n" + acmeKeysAll + `    quota: {outbox_mib: 1}
  - id: beta
    keys:
      - {id: app, kind: app, secret: beta-app-secret}
      - {id: cron, kind: deliver, secret: beta-cron-secret}
`
	for name, start := range map[string]func(*testing.T, string) *env{"single": startTenantSingle, "cluster": startTenantCluster} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "tenants.yaml")
			writeTenants(t, path, file)
			e := start(t, path)
			wantOK202(t, e.call(t, "POST", "/v1/deliver", betaCron, map[string]any{"target": "tel-1", "text": "beta's standup", "ttl": 600}))

			const devices, each, size = 10, 15, 10_000 // 1.5 MB
			text := strings.Repeat("x", size)
			var batch []map[string]any
			for i := range each {
				for d := range devices {
					batch = append(batch, map[string]any{"target": fmt.Sprint("tel-", d), "text": fmt.Sprint(i, text), "ttl": 600})
				}
			}
			r := e.call(t, "POST", "/v1/deliver/batch", acmeCron, map[string]any{"deliveries": batch})
			if r.status != http.StatusOK || strings.Count(string(r.body), `"status":202`) != devices*each {
				t.Fatalf("acme's flood: %d %.300s; want every delivery queued (202)", r.status, r.body)
			}
			kept, items := 0, 0
			for d := range devices {
				got, err := e.store.PeekOutbox(t.Context(), tenant.DeviceKey("acme", fmt.Sprint("tel-", d)), 0)
				if err != nil {
					t.Fatal(err)
				}
				for _, it := range got {
					kept += len(it.Data)
				}
				items += len(got)
				// Its own oldest went: the newest of each device stays.
				if len(got) == 0 || !strings.Contains(string(got[len(got)-1].Data), fmt.Sprint(each-1, "xxx")) {
					t.Fatalf("acme's tel-%d lost its newest delivery (%d items kept)", d, len(got))
				}
			}
			t.Logf("acme pushed %d deliveries of %d bytes: %d items, %d bytes kept", devices*each, size, items, kept)
			if kept > 1<<20 || items == devices*each {
				t.Fatalf("acme's outboxes keep %d bytes in %d items; want at most its 1 MiB, with items dropped", kept, items)
			}
			b := e.phoneAs(t, betaApp, "tel-1")
			expectText(t, b, "beta's standup")
			// Each item the quota dropped is one of acme's refusals.
			var got int64
			if !testsvc.Eventually(10*time.Second, func() bool { // the nodes flush every second
				var u usageAnswer
				if err := json.Unmarshal(e.call(t, "GET", "/v1/usage", acmeAgent, nil).body, &u); err != nil {
					t.Fatal(err)
				}
				got = u.Counters.QuotaRefusals.OutboxMiB
				return got == int64(devices*each-items)
			}) {
				t.Fatalf("acme's usage counts %d refusals of outbox_mib, want the %d items dropped", got, devices*each-items)
			}
		})
	}
}

// secondEdge starts another edge node beside e's, on its Redis and NATS,
// and returns it as an env for phones.
func secondEdge(t *testing.T, e *env) *env {
	t.Helper()
	g, err := gateway.Start(t.Context(), e.nodeConfig, testLogger(t, "node-2"))
	if err != nil {
		t.Fatalf("start node 2: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return &env{node: g}
}

// TestOwnerConnectionsAcrossEdges: acme's connections quota (3) holds
// across two edges: exactly 3 sockets, on either, are ready; the 4th hello
// is a fatal internal_error naming the quota, close 1008, on each edge,
// while beta's phone is served; a reconnect of a device that replaces its
// socket on the other edge keeps its place; one closed lets the next in.
func TestOwnerConnectionsAcrossEdges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeTenants(t, path, "tenants:\n  - id: acme\n    keys:\n"+acmeKeysAll+`    quota: {connections: 3}
  - id: beta
    keys:
      - {id: app, kind: app, secret: beta-app-secret}
`)
	reg := openTenants(t, path)
	e1 := startClusterOf(t, apiConfig(func(c *router.APIConfig) { c.Tenants = reg }), reg)
	e2 := secondEdge(t, e1)
	conns := tenant.QuotaKey("acme", tenant.QuotaConnections)
	count := func() int {
		t.Helper()
		n, err := e1.store.LeaseCount(t.Context(), conns)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	refused := func(e *env, dev string) {
		t.Helper()
		f, ci := e.helloRefused(t, acmeApp, dev)
		if f.Str("code") != "internal_error" || f.Get("fatal") != true || !strings.Contains(f.Str("message"), "connections quota") ||
			ci.Code != protocol.CloseCode {
			t.Fatalf("acme's hello past its quota: %s, close %v; want a fatal internal_error naming the quota, close %d", f, ci, protocol.CloseCode)
		}
	}

	a := e1.phoneAs(t, acmeApp, "tel-a")
	b := e1.phoneAs(t, acmeApp, "tel-b")
	e2.phoneAs(t, acmeApp, "tel-c")
	if n := count(); n != 3 {
		t.Fatalf("acme's sockets in the store: %d, want 3", n)
	}
	refused(e2, "tel-d")
	refused(e1, "tel-d")
	e2.phoneAs(t, betaApp, "tel-d") // the other owner is served

	// tel-a reconnects on the other edge: its own place, not refused; the
	// socket it replaces is closed and does not give the place back.
	e2.phoneAs(t, acmeApp, "tel-a")
	if _, err := a.ExpectClose(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("the replaced socket of tel-a: %v", err)
	}
	// One closed lets the next in.
	b.CloseNow()
	// 2 at once, not 1: had tel-a's old socket given its place back, only
	// the edges' next renewal (every 10 s) would take it again.
	testsvc.WaitFor(t, 5*time.Second, "tel-b's place given back", func() bool { return count() == 2 })
	e1.phoneAs(t, acmeApp, "tel-d")
	refused(e1, "tel-e") // 3 again: tel-a's place stayed taken
	if n := count(); n != 3 {
		t.Fatalf("acme's sockets in the store: %d, want 3", n)
	}
}

// TestOwnerDeliveriesPerSecond: an owner's deliveries_per_second (3)
// holds across two routers, in seconds of the store's clock: exactly 3
// deliveries (single or of a batch, delivered or offline) are taken in a
// second on either; one more is 429 too_many_deliveries with Retry-After
// on each, a batch that does not fit whole is refused whole and costs
// nothing, the other owner and the legacy tokens are served, and the next
// second takes 3 again.
func TestOwnerDeliveriesPerSecond(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeTenants(t, path, strings.Replace(quotaTenants, "quota: {event_reads: 3}", "quota: {deliveries_per_second: 3}", 1))
	reg := openTenants(t, path)
	e := startClusterOf(t, apiConfig(func(c *router.APIConfig) { c.Tenants = reg }), reg)
	// A quarter into a second of the routers' and their stores' clock.
	clk := clock.NewFake(time.Unix(1_900_000_000, 250*int64(time.Millisecond)))
	r1, _ := secondRouter(t, e, reg, clk)
	r2, _ := secondRouter(t, e, reg, clk)
	one := map[string]any{"target": "tel-1", "text": "standup"}
	batch := func(n int) map[string]any {
		var ds []map[string]any
		for range n {
			ds = append(ds, one)
		}
		return map[string]any{"deliveries": ds}
	}
	refused := func(r response) {
		t.Helper()
		wantError(t, r, http.StatusTooManyRequests, "too_many_deliveries")
		if got := r.header.Get("Retry-After"); got != "1" {
			t.Fatalf("Retry-After %q, want 1 (the second ends in 750 ms)", got)
		}
	}
	// Nobody holds tel-1 on these routers' bus: each delivery is taken
	// and answered offline.
	wantError(t, r1.call(t, "POST", "/v1/deliver", acmeCron, one), http.StatusNotFound, "device_offline")
	wantError(t, r2.call(t, "POST", "/v1/deliver", acmeCron, one), http.StatusNotFound, "device_offline")
	refused(r1.call(t, "POST", "/v1/deliver/batch", acmeCron, batch(2))) // 2 + 2 > 3: refused whole
	if r := r1.call(t, "POST", "/v1/deliver/batch", acmeCron, batch(1)); r.status != http.StatusOK {
		t.Fatalf("acme's third delivery, a batch of one: %d %s", r.status, r.body)
	}
	refused(r2.call(t, "POST", "/v1/deliver", acmeCron, one))
	refused(r1.call(t, "POST", "/v1/deliver", acmeCron, one))
	// An invalid delivery is answered as such and takes nothing.
	wantError(t, r1.call(t, "POST", "/v1/deliver", acmeCron, map[string]any{"target": "tel-1"}), http.StatusBadRequest, "bad_frame")
	// The others are served.
	wantError(t, r2.call(t, "POST", "/v1/deliver", betaCron, one), http.StatusNotFound, "device_offline")
	wantError(t, r2.call(t, "POST", "/v1/deliver", deliverToken, one), http.StatusNotFound, "device_offline")

	clk.Advance(750 * time.Millisecond) // the next second
	refused2 := r2.call(t, "POST", "/v1/deliver/batch", acmeCron, batch(4))
	wantError(t, refused2, http.StatusTooManyRequests, "too_many_deliveries")
	if r := r2.call(t, "POST", "/v1/deliver/batch", acmeCron, batch(3)); r.status != http.StatusOK {
		t.Fatalf("acme's 3 in the next second: %d %s", r.status, r.body)
	}
	refused(r1.call(t, "POST", "/v1/deliver", acmeCron, one))
}
