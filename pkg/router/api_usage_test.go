package router_test

// GET /v1/usage: each owner's agent reads its own owner's counters,
// summed over every node of the cluster, and nothing of another's.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/usage"
)

// usageAnswer is GET /v1/usage's answer, as docs/api.md gives it.
type usageAnswer struct {
	Owner string `json:"owner"`
	Quota *struct {
		OutboxMiB           int `json:"outbox_mib"`
		Connections         int `json:"connections"`
		EventReads          int `json:"event_reads"`
		DeliveriesPerSecond int `json:"deliveries_per_second"`
	} `json:"quota"`
	Since    *time.Time `json:"since"`
	Counters struct {
		MessagesIn  int64 `json:"messages_in"`
		MessagesOut int64 `json:"messages_out"`
		Deliveries  struct {
			Accepted int64 `json:"accepted"`
			Offline  int64 `json:"offline"`
		} `json:"deliveries"`
		ConnectionsOpened int64 `json:"connections_opened"`
		QuotaRefusals     struct {
			OutboxMiB           int64 `json:"outbox_mib"`
			Connections         int64 `json:"connections"`
			EventReads          int64 `json:"event_reads"`
			DeliveriesPerSecond int64 `json:"deliveries_per_second"`
		} `json:"quota_refusals"`
	} `json:"counters"`
	Live struct {
		Connections *int64 `json:"connections"`
		EventReads  *int64 `json:"event_reads"`
	} `json:"live"`
}

// counts are the counters a test expects of one owner.
type counts struct {
	in, out, accepted, offline, opened int64
}

func (a usageAnswer) counts() counts {
	c := a.Counters
	return counts{c.MessagesIn, c.MessagesOut, c.Deliveries.Accepted, c.Deliveries.Offline, c.ConnectionsOpened}
}

func usageOf(t *testing.T, base, token string) usageAnswer {
	t.Helper()
	r := callURL(t, base, "GET", "/v1/usage", token, nil, nil)
	if r.status != http.StatusOK {
		t.Fatalf("GET /v1/usage: %d %s", r.status, r.body)
	}
	var a usageAnswer
	if err := json.Unmarshal(r.body, &a); err != nil {
		t.Fatalf("GET /v1/usage: %v: %s", err, r.body)
	}
	return a
}

// waitUsage polls GET /v1/usage on base until token's owner's counters
// are want (the nodes flush every second), and returns the answer.
func waitUsage(t *testing.T, base, token string, want counts) usageAnswer {
	t.Helper()
	var a usageAnswer
	if !testsvc.Eventually(10*time.Second, func() bool { a = usageOf(t, base, token); return a.counts() == want }) {
		t.Fatalf("GET /v1/usage at %s: %+v after 10 s, want %+v", base, a.counts(), want)
	}
	return a
}

// wantLive checks a's live counts of sockets and event reads.
func wantLive(t *testing.T, a usageAnswer, conns, reads int64) {
	t.Helper()
	if l := a.Live; l.Connections == nil || l.EventReads == nil || *l.Connections != conns || *l.EventReads != reads {
		t.Errorf("%s's live counts %+v, want %d sockets and %d reads", a.Owner, l, conns, reads)
	}
}

// usageCluster is an edge node and two routers with an API each, on a
// real Redis and NATS, reading one tenants file: each process counts its
// owners' usage and flushes it to the store, as a deployment's do.
func usageCluster(t *testing.T, reg *tenant.Registry) (edge *env, apis [2]string) {
	t.Helper()
	redisURL, natsURL := testsvc.RedisURL(t), testsvc.NATSURL(t)
	prefix := "hermes-routertest:" + testsvc.RandomHex(6) + ":"
	cleanRedis(t, redisURL, prefix)
	natsPrefix := "rt" + testsvc.RandomHex(3) + "."
	nc := nodeConfig()
	nc.NATSURL, nc.NATSPrefix, nc.RedisURL, nc.RedisPrefix, nc.Tenants = natsURL, natsPrefix, redisURL, prefix, reg
	g, err := gateway.Start(t.Context(), nc, testLogger(t, "edge"))
	if err != nil {
		t.Fatalf("start the edge: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	edge = &env{node: g}
	for i := range apis {
		log := testLogger(t, "router")
		st, err := redisstore.New(t.Context(), redisstore.Options{URL: redisURL, Prefix: prefix})
		if err != nil {
			t.Fatalf("redisstore: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		b, err := natsbus.Connect(natsURL, natsbus.Options{Logger: log, Name: "router-test", SubjectPrefix: natsPrefix})
		if err != nil {
			t.Fatalf("natsbus: %v", err)
		}
		t.Cleanup(func() { b.Close() })
		r := router.New(router.Config{}, st, b, agent.NewLink(st, 1000), log)
		if err := r.Start(); err != nil {
			t.Fatalf("router: %v", err)
		}
		t.Cleanup(func() { r.Close() })
		u, err := usage.New(usage.Options{Tenants: reg, Store: st, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxFor(t, time.Hour)
		go u.Run(ctx)
		apis[i] = startHTTP(t, router.NewAPI(r, apiConfig(func(c *router.APIConfig) { c.Tenants, c.Usage = reg, u })))
	}
	return edge, apis
}

// TestUsage: two owners and the legacy owner use one edge and two
// routers: each agent reads, from either router, exactly its own owner's
// counters (its phones' messages in, what was written to them, cron's
// deliveries accepted and offline, its phones' connections) and quota.
func TestUsage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeTenants(t, path, tenantsFile(acmeKeysAll)+"    quota: {connections: 5, event_reads: 1}\n") // beta's
	reg := openTenants(t, path)
	e, apis := usageCluster(t, reg)
	a, b := apis[0], apis[1]

	// Nothing counted yet: zeros, no since, and each owner's quota.
	fresh := usageOf(t, a, acmeAgent)
	if fresh.Owner != "acme" || fresh.Since != nil || fresh.counts() != (counts{}) {
		t.Fatalf("acme before anything: %+v", fresh)
	}
	if q := fresh.Quota; q == nil || q.OutboxMiB != 64 || q.Connections != 1000 || q.EventReads != 8 || q.DeliveriesPerSecond != 1000 {
		t.Fatalf("acme's quota %+v, want the defaults 64, 1000, 8, 1000", q)
	}
	if q := usageOf(t, b, betaAgent).Quota; q == nil || q.OutboxMiB != 64 || q.Connections != 5 || q.EventReads != 1 {
		t.Fatalf("beta's quota %+v, want 64, 5 and 1 (its file's)", q)
	}
	wantLive(t, fresh, 0, 0)
	if l := usageOf(t, a, agentToken).Live; l.Connections != nil || l.EventReads != nil {
		t.Errorf("the legacy owner's live counts %+v: it holds no leases, want null", l)
	}

	acme := e.phoneAs(t, acmeApp, "tel-1")
	beta := e.phoneAs(t, betaApp, "tel-1")
	legacy := e.phoneAs(t, phoneToken, "tel-1")
	e.phoneAs(t, acmeTel2, "tel-2")

	// Messages in: acme 2, beta 1, legacy 1 (a repeated id is not one).
	for _, m := range []struct {
		c  interface{ Text(id, text string) error }
		id string
	}{{acme, "a-1"}, {acme, "a-2"}, {acme, "a-2"}, {beta, "b-1"}, {legacy, "l-1"}} {
		if err := m.c.Text(m.id, "hello"); err != nil {
			t.Fatal(err)
		}
	}
	// Cron on both routers: acme 1 accepted and 1 offline, beta a batch
	// of 2 accepted, legacy 1 accepted.
	wantOK(t, callURL(t, a, "POST", "/v1/deliver", acmeCron, map[string]any{"target": "tel-1", "text": "acme cron"}, nil))
	expectText(t, acme, "acme cron")
	wantError(t, callURL(t, b, "POST", "/v1/deliver", acmeCron, map[string]any{"target": "tel-9", "text": "nobody"}, nil), http.StatusNotFound, "device_offline")
	r := callURL(t, b, "POST", "/v1/deliver/batch", betaCron, map[string]any{"deliveries": []map[string]any{
		{"target": "tel-1", "text": "beta 1"}, {"target": "tel-1", "text": "beta 2"}}}, nil)
	if r.status != http.StatusOK {
		t.Fatalf("beta's batch: %d %s", r.status, r.body)
	}
	expectText(t, beta, "beta 1")
	expectText(t, beta, "beta 2")
	wantOK(t, callURL(t, b, "POST", "/v1/deliver", deliverToken, map[string]any{"target": "tel-1", "text": "legacy cron"}, nil))
	expectText(t, legacy, "legacy cron")
	// The agent: acme 1 message on router b, which is one more out; its
	// streamed edit is the same message.
	wantOK(t, callURL(t, b, "POST", "/v1/sessions/tel-1/messages", acmeAgent, map[string]any{"id": "m-1", "text": "acme", "final": false}, nil))
	expectText(t, acme, "acme")
	wantOK(t, callURL(t, a, "POST", "/v1/sessions/tel-1/messages", acmeAgent, map[string]any{"id": "m-1", "text": "acme agent", "edit": true}, nil))
	expectText(t, acme, "acme agent")

	// Live: the sockets open now, over the cluster.
	wantLive(t, usageOf(t, b, acmeAgent), 2, 0)
	wantLive(t, usageOf(t, a, betaAgent), 1, 0)
	// A read held open is live; beta's second, on the other router, is
	// past its event_reads and counted as its refusal.
	var page struct{ Cursor string }
	if err := json.Unmarshal(callURL(t, a, "GET", "/v1/events?format=json", betaAgent, nil, nil).body, &page); err != nil {
		t.Fatal(err)
	}
	held, stop := context.WithCancel(t.Context())
	defer stop()
	go func() { // waits after the log's last entry: open until stopped
		req, _ := http.NewRequestWithContext(held, "GET", a+"/v1/events?wait=30&cursor="+page.Cursor, nil)
		req.Header.Set("Authorization", "Bearer "+betaAgent)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testsvc.WaitFor(t, 10*time.Second, "beta's long poll counted live", func() bool {
		l := usageOf(t, b, betaAgent).Live
		return l.EventReads != nil && *l.EventReads == 1
	})
	wantError(t, callURL(t, b, "GET", "/v1/events?format=json", betaAgent, nil, nil), http.StatusTooManyRequests, "too_many_streams")
	stop()
	if !testsvc.Eventually(10*time.Second, func() bool { return usageOf(t, a, betaAgent).Counters.QuotaRefusals.EventReads == 1 }) {
		t.Fatalf("beta's refused read is not counted: %+v", usageOf(t, a, betaAgent).Counters.QuotaRefusals)
	}

	wantAcme := counts{in: 2, out: 2, accepted: 1, offline: 1, opened: 2}
	wantBeta := counts{in: 1, out: 2, accepted: 2, opened: 1}
	wantLegacy := counts{in: 1, out: 1, accepted: 1, opened: 1}
	for _, base := range apis {
		got := waitUsage(t, base, acmeAgent, wantAcme)
		if got.Owner != "acme" || got.Since == nil || time.Since(*got.Since) > time.Minute {
			t.Errorf("acme's answer %+v: want owner acme and a since of now", got)
		}
		if got := waitUsage(t, base, betaAgent, wantBeta); got.Owner != "beta" {
			t.Errorf("beta's answer names %q", got.Owner)
		}
		got = waitUsage(t, base, agentToken, wantLegacy)
		if got.Owner != tenant.Legacy || got.Quota != nil {
			t.Errorf("the legacy owner's answer %+v: want owner \"\" and no quota", got)
		}
	}
	// Both routers answer the same, from the store.
	if x, y := usageOf(t, a, acmeAgent), usageOf(t, b, acmeAgent); !reflect.DeepEqual(x, y) {
		t.Errorf("the routers answer acme differently: %+v and %+v", x, y)
	}

	// Only an agent key asks, and only for its own owner.
	for _, tok := range []string{acmeCron, acmeApp, acmeTel2, betaCron, deliverToken} {
		wantError(t, callURL(t, a, "GET", "/v1/usage", tok, nil, nil), http.StatusForbidden, "forbidden")
	}
	wantError(t, callURL(t, a, "GET", "/v1/usage", "", nil, nil), http.StatusUnauthorized, "auth_failed")
	wantError(t, callURL(t, a, "GET", "/v1/usage", tenant.Credential("acme", "hermes", "wrong"), nil, nil), http.StatusUnauthorized, "auth_failed")
	// Nothing in the request names another owner: a query is ignored.
	r = callURL(t, a, "GET", "/v1/usage?owner=beta", acmeAgent, nil, nil)
	var other usageAnswer
	if err := json.Unmarshal(r.body, &other); err != nil || other.Owner != "acme" || other.counts() != wantAcme {
		t.Errorf("acme asking for ?owner=beta: %d %s", r.status, r.body)
	}
}

// TestOwnerMetrics: a single node's hermes_owner_* series, read from its
// /metrics (the OTel SDK through its Prometheus exporter), count each
// owner's own: the sockets open and opened, messages in and out, cron's
// deliveries by result; the legacy owner's are labelled _legacy; its
// GET /v1/usage answers the same counts; a reload that removes an owner
// removes its series.
func TestOwnerMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeTenants(t, path, tenantsFile(acmeKeysAll))
	reg := openTenants(t, path)
	tel, err := telemetry.New(t.Context(), telemetry.Config{ServiceName: "hermes-router"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	nc := nodeConfig()
	nc.Router, nc.NewAgent, nc.APIListen, nc.Tenants, nc.Telemetry = true, agent.Named("link", agent.OpenAIConfig{}, 0), "127.0.0.1:0", reg, tel
	nc.API = apiConfig(nil)
	g, err := gateway.Start(t.Context(), nc, testLogger(t, "node"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	e := &env{node: g, router: g.Router, store: g.Store, api: g.API, url: g.APIURL()}
	scrape := func() string {
		rec := httptest.NewRecorder()
		tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	// waitLines polls /metrics until it has every line of want.
	waitLines := func(want ...string) string {
		t.Helper()
		var body, missing string
		if !testsvc.Eventually(10*time.Second, func() bool {
			body, missing = scrape(), ""
			for _, w := range want {
				if !strings.Contains(body, w+"\n") {
					missing = w
					break
				}
			}
			return missing == ""
		}) {
			t.Fatalf("/metrics lacks %q after 10 s:\n%s", missing, grepOwner(body))
		}
		return body
	}
	waitLines(`hermes_owner_connections{owner="acme"} 0`, `hermes_owner_connections{owner="beta"} 0`,
		`hermes_owner_connections{owner="_legacy"} 0`, `hermes_owner_messages_in_total{owner="beta"} 0`,
		`hermes_owner_deliveries_total{owner="acme",result="offline"} 0`,
		`hermes_owner_quota_refusals_total{owner="acme",quota="event_reads"} 0`)

	acme := e.phoneAs(t, acmeApp, "tel-1")
	acme2 := e.phoneAs(t, acmeTel2, "tel-2")
	beta := e.phoneAs(t, betaApp, "tel-1")
	e.phoneAs(t, phoneToken, "tel-1")
	for _, m := range []struct {
		c  interface{ Text(id, text string) error }
		id string
	}{{acme, "a-1"}, {beta, "b-1"}, {beta, "b-2"}} {
		if err := m.c.Text(m.id, "hello"); err != nil {
			t.Fatal(err)
		}
	}
	wantOK(t, e.call(t, "POST", "/v1/deliver", acmeCron, map[string]any{"target": "tel-1", "text": "acme cron"}))
	expectText(t, acme, "acme cron")
	wantError(t, e.call(t, "POST", "/v1/deliver", betaCron, map[string]any{"target": "tel-5", "text": "away"}), http.StatusNotFound, "device_offline")
	acme2.CloseNow()
	waitLines(`hermes_owner_connections{owner="acme"} 1`, `hermes_owner_connections{owner="beta"} 1`,
		`hermes_owner_connections{owner="_legacy"} 1`,
		`hermes_owner_connections_opened_total{owner="acme"} 2`, `hermes_owner_connections_opened_total{owner="beta"} 1`,
		`hermes_owner_messages_in_total{owner="acme"} 1`, `hermes_owner_messages_in_total{owner="beta"} 2`,
		`hermes_owner_messages_in_total{owner="_legacy"} 0`,
		`hermes_owner_messages_out_total{owner="acme"} 1`, `hermes_owner_messages_out_total{owner="beta"} 0`,
		`hermes_owner_deliveries_total{owner="acme",result="accepted"} 1`, `hermes_owner_deliveries_total{owner="acme",result="offline"} 0`,
		`hermes_owner_deliveries_total{owner="beta",result="offline"} 1`, `hermes_owner_deliveries_total{owner="beta",result="accepted"} 0`)

	// A single node (the memory store) answers GET /v1/usage the same.
	waitUsage(t, e.url, acmeAgent, counts{in: 1, out: 1, accepted: 1, opened: 2})
	waitUsage(t, e.url, betaAgent, counts{in: 2, offline: 1, opened: 1})
	waitUsage(t, e.url, agentToken, counts{opened: 1})

	// beta leaves the file: its socket closes, its series go.
	writeTenants(t, path, "tenants:\n  - id: acme\n    keys:\n"+acmeKeysAll)
	if _, err := beta.ExpectClose(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("beta's phone after beta left the file: %v", err)
	}
	body := waitLines(`hermes_owner_connections{owner="acme"} 1`, `hermes_owner_messages_in_total{owner="acme"} 1`)
	if strings.Contains(body, `owner="beta"`) {
		t.Errorf("an owner removed from the file still has series:\n%s", grepOwner(body))
	}
	wantError(t, e.call(t, "GET", "/v1/usage", betaAgent, nil), http.StatusUnauthorized, "auth_failed")
}

// grepOwner is the hermes_owner_ lines of a /metrics body.
func grepOwner(body string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "hermes_owner_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
