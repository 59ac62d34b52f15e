package router_test

// Two owners of one tenants file and the legacy owner on one cluster: an
// edge node and a router of its own, a real Redis and NATS, phones over
// real sockets. Each owner's phones, cron and agent see only their own.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// The owners' credentials.
var (
	acmeApp     = tenant.Credential("acme", "app", "acme-app-secret")
	acmeApp2    = tenant.Credential("acme", "app2", "acme-app2-secret")
	acmeTel2    = tenant.Credential("acme", "tel2", "acme-tel2-secret")
	acmeAgent   = tenant.Credential("acme", "hermes", "acme-agent-secret")
	acmeCron    = tenant.Credential("acme", "cron", "acme-cron-secret")
	betaApp     = tenant.Credential("beta", "app", "beta-app-secret")
	betaAgent   = tenant.Credential("beta", "hermes", "beta-agent-secret")
	betaCron    = tenant.Credential("beta", "cron", "beta-cron-secret")
	acmeKeysAll = `      - {id: app, kind: app, secret_sha256: "` + tenant.SecretSHA256("acme-app-secret") + `"}
      - {id: tel2, kind: device, device: tel-2, secret: acme-tel2-secret}
      - {id: hermes, kind: agent, secret: acme-agent-secret}
      - {id: cron, kind: deliver, secret: acme-cron-secret}
`
)

func tenantsFile(acmeKeys string) string {
	return "tenants:\n  - id: acme\n    keys:\n" + acmeKeys + `  - id: beta
    keys:
      - {id: app, kind: app, secret: beta-app-secret}
      - {id: hermes, kind: agent, secret: beta-agent-secret}
      - {id: cron, kind: deliver, secret: beta-cron-secret}
`
}

// writeTenants replaces the file as a deploy would: written beside it,
// renamed over it.
func writeTenants(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".new", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// openTenants opens the tenants file at path, read again every 50 ms
// until t ends.
func openTenants(t *testing.T, path string) *tenant.Registry {
	t.Helper()
	reg, err := tenant.Open(tenant.Options{Path: path, Interval: 50 * time.Millisecond, Log: testLogger(t, "tenants")})
	if err != nil {
		t.Fatal(err)
	}
	go reg.Run(t.Context(), nil)
	return reg
}

// startTenantSingle is startSingle with the tenants file at path for the
// edge and the router API: the memory store, an embedded NATS.
func startTenantSingle(t *testing.T, path string) *env {
	t.Helper()
	reg := openTenants(t, path)
	nc := nodeConfig()
	nc.Router, nc.NewAgent, nc.APIListen, nc.Tenants = true, agent.Named("link", agent.OpenAIConfig{}, 0), "127.0.0.1:0", reg
	nc.API = apiConfig(nil)
	g, err := gateway.Start(t.Context(), nc, testLogger(t, "node"))
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return &env{node: g, router: g.Router, store: g.Store, api: g.API, url: g.APIURL()}
}

// startTenantCluster is startCluster with the tenants file at path for
// the edge and the router API.
func startTenantCluster(t *testing.T, path string) *env {
	t.Helper()
	reg := openTenants(t, path)
	return startClusterOf(t, apiConfig(func(c *router.APIConfig) { c.Tenants = reg }), reg)
}

// phoneAs connects a phone as dev with token; it fails the test unless
// the hello is answered ready.
func (e *env) phoneAs(t *testing.T, token, dev string) *client.Conn {
	t.Helper()
	c, err := client.Dial(ctxFor(t, 10*time.Second), e.node.URL(), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.CloseNow() })
	ready, err := c.Hello(ctxFor(t, 10*time.Second), token, protocol.Device{ID: dev, Name: "Phone"}, protocol.User{ID: "u-1"})
	if err != nil {
		t.Fatalf("hello as %s: %v", dev, err)
	}
	// The phone sees its own id, never the key it has inside the cluster.
	if got := ready.Str("session"); got != "mobile:"+dev {
		t.Fatalf("ready session %q, want mobile:%s", got, dev)
	}
	if got := ready.Map("device").Str("id"); got != dev {
		t.Fatalf("ready device id %q, want %s", got, dev)
	}
	return c
}

// helloRefused says hello as dev with token and returns the error frame
// and the close that answer it.
func (e *env) helloRefused(t *testing.T, token, dev string) (client.Frame, *client.CloseInfo) {
	t.Helper()
	c, err := client.Dial(ctxFor(t, 10*time.Second), e.node.URL(), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.CloseNow() })
	if err := c.Send(map[string]any{"t": "hello", "token": token, "device": map[string]any{"id": dev}}); err != nil {
		t.Fatal(err)
	}
	f, err := c.Expect(ctxFor(t, 10*time.Second), "error")
	if err != nil {
		t.Fatalf("hello as %s: want an error frame: %v", dev, err)
	}
	ci, err := c.ExpectClose(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatalf("hello as %s: want a close: %v", dev, err)
	}
	return f, ci
}

// expectText waits for c's next message and checks its text.
func expectText(t *testing.T, c *client.Conn, want string) {
	t.Helper()
	if f := expect(t, c, "message"); f.Str("text") != want {
		t.Fatalf("message %q, want %q", f.Str("text"), want)
	}
}

func TestOwnersAreIsolated(t *testing.T) {
	for name, start := range map[string]func(*testing.T, string) *env{"single": startTenantSingle, "cluster": startTenantCluster} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tenants.yaml")
			writeTenants(t, path, tenantsFile(acmeKeysAll))
			testOwnersAreIsolated(t, path, start(t, path))
		})
	}
}

func testOwnersAreIsolated(t *testing.T, path string, e *env) {

	// Three tel-1 at once: acme's, beta's and the legacy owner's.
	acme := e.phoneAs(t, acmeApp, "tel-1")
	beta := e.phoneAs(t, betaApp, "tel-1")
	legacy := e.phoneAs(t, phoneToken, "tel-1")

	t.Run("cron reaches its own owner's phone", func(t *testing.T) {
		for _, c := range []struct {
			token string
			to    *client.Conn
		}{{acmeCron, acme}, {betaCron, beta}, {deliverToken, legacy}} {
			text := "cron " + testsvc.RandomHex(4)
			wantOK(t, e.call(t, "POST", "/v1/deliver", c.token, map[string]any{"target": "mobile:tel-1", "text": text}))
			expectText(t, c.to, text)
		}
		// Each phone got exactly its own: the next message of each is
		// the one sent after.
		for _, c := range []struct {
			token string
			to    *client.Conn
		}{{acmeCron, acme}, {betaCron, beta}, {deliverToken, legacy}} {
			text := "after " + testsvc.RandomHex(4)
			wantOK(t, e.call(t, "POST", "/v1/deliver", c.token, map[string]any{"target": "tel-1", "text": text}))
			expectText(t, c.to, text)
		}
	})

	t.Run("the agent reaches its own owner's phone", func(t *testing.T) {
		for _, c := range []struct {
			token string
			to    *client.Conn
		}{{acmeAgent, acme}, {betaAgent, beta}, {agentToken, legacy}, {acmeAgent, acme}} {
			text := "agent " + testsvc.RandomHex(4)
			wantOK(t, e.call(t, "POST", "/v1/sessions/mobile:tel-1/messages", c.token, map[string]any{"text": text}))
			expectText(t, c.to, text)
		}
	})

	t.Run("a batch reaches its own owner's phones", func(t *testing.T) {
		r := e.call(t, "POST", "/v1/deliver/batch", betaCron, map[string]any{"deliveries": []map[string]any{
			{"target": "tel-1", "text": "beta batch 1"}, {"target": "tel-1", "text": "beta batch 2"},
		}})
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"status":200`) || strings.Contains(string(r.body), `"status":4`) {
			t.Fatalf("beta's batch: %d %s", r.status, r.body)
		}
		expectText(t, beta, "beta batch 1")
		expectText(t, beta, "beta batch 2")
		wantOK(t, e.call(t, "POST", "/v1/deliver", acmeCron, map[string]any{"target": "tel-1", "text": "acme after the batch"}))
		expectText(t, acme, "acme after the batch")
	})

	t.Run("a card is its own owner's phone's", func(t *testing.T) {
		card, _ := wantOK(t, e.call(t, "POST", "/v1/sessions/tel-1/prompts", acmeAgent, map[string]any{"kind": "slash_confirm", "text": "Proceed?"}))["id"].(string)
		p := expect(t, acme, protocol.TypePrompt)
		if p.Str("id") != card || p.Str("session") != "mobile:tel-1" {
			t.Fatalf("acme's card: %s, want %s for mobile:tel-1", p, card)
		}
		// beta's tel-1 answers acme's card: not its device's.
		if err := beta.Answer(card, "once", ""); err != nil {
			t.Fatal(err)
		}
		if f := expect(t, beta, protocol.TypeError); f.Str("code") != "forbidden" {
			t.Fatalf("beta answering acme's card: %s, want forbidden", f)
		}
		if err := acme.Answer(card, "once", ""); err != nil {
			t.Fatal(err)
		}
		if f := expect(t, acme, protocol.TypePromptDone); f.Str("id") != card || f.Str("option_id") != "once" {
			t.Fatalf("acme answering its card: %s", f)
		}
	})

	t.Run("a push registration is its own owner's device's", func(t *testing.T) {
		wantOK(t, e.call(t, "PUT", "/v1/devices/tel-1/push", acmeAgent, map[string]any{"kind": "webhook", "url": "https://push.example.com/acme"}))
		ctx := ctxFor(t, 5*time.Second)
		got, err := e.store.PushTarget(ctx, tenant.DeviceKey("acme", "tel-1"))
		if err != nil || !strings.Contains(string(got), "push.example.com/acme") {
			t.Fatalf("acme's tel-1 push target: %s, %v", got, err)
		}
		for _, key := range []string{tenant.DeviceKey("beta", "tel-1"), "tel-1"} {
			if got, err := e.store.PushTarget(ctx, key); err == nil && len(got) > 0 {
				t.Errorf("%q got acme's push target: %s", key, got)
			}
		}
	})

	t.Run("another owner's device key reaches nothing of theirs", func(t *testing.T) {
		acmeKey := tenant.DeviceKey("acme", "tel-1")
		// Beta names acme's device key: that is beta's own device of that
		// id, which is offline.
		wantError(t, e.call(t, "POST", "/v1/deliver", betaCron, map[string]any{"target": acmeKey, "text": "stolen"}),
			http.StatusNotFound, "device_offline")
		// The legacy owner may not name such an id at all.
		wantError(t, e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": acmeKey, "text": "stolen"}),
			http.StatusBadRequest, "bad_frame")
		wantError(t, e.call(t, "POST", "/v1/sessions/"+url.PathEscape("mobile:"+acmeKey)+"/messages", agentToken, map[string]any{"text": "stolen"}),
			http.StatusBadRequest, "bad_frame")
		f, ci := e.helloRefused(t, phoneToken, acmeKey)
		if f.Str("code") != "bad_frame" || ci.Code != protocol.CloseCode {
			t.Errorf("a legacy hello as acme's device key: %s, close %v; want bad_frame, %d", f, ci, protocol.CloseCode)
		}
		// acme's phone got none of it: its next message is this one.
		wantOK(t, e.call(t, "POST", "/v1/deliver", acmeCron, map[string]any{"target": "tel-1", "text": "still mine"}))
		expectText(t, acme, "still mine")
	})

	t.Run("a hello as another owner's device id takes nothing of theirs", func(t *testing.T) {
		// acme keeps a message for its tel-3, which is away.
		wantOK202(t, e.call(t, "POST", "/v1/deliver", acmeCron, map[string]any{"target": "tel-3", "text": "acme's secret", "ttl": 600}))
		// beta's phone says it is tel-3: it is beta's tel-3, with none
		// of acme's outbox; its first message is beta's own.
		b3 := e.phoneAs(t, betaApp, "tel-3")
		wantOK(t, e.call(t, "POST", "/v1/deliver", betaCron, map[string]any{"target": "tel-3", "text": "beta's own"}))
		expectText(t, b3, "beta's own")
		// acme's phone is still connected: it gets what comes now.
		wantOK(t, e.call(t, "POST", "/v1/deliver", acmeCron, map[string]any{"target": "tel-1", "text": "acme still here"}))
		expectText(t, acme, "acme still here")
		// And acme's tel-3 gets its message when it comes.
		a3 := e.phoneAs(t, acmeApp, "tel-3")
		expectText(t, a3, "acme's secret")
		// A device that acme binds to a device key is not its app key's,
		// nor beta's app key's the same device.
		f, ci := e.helloRefused(t, acmeApp, "tel-2")
		if f.Str("code") != "forbidden" || ci.Code != protocol.CloseCode {
			t.Errorf("acme's app key as acme's bound tel-2: %s, close %v; want forbidden", f, ci)
		}
		e.phoneAs(t, acmeTel2, "tel-2")
		e.phoneAs(t, betaApp, "tel-2")
	})

	t.Run("wrong keys are auth_failed", func(t *testing.T) {
		for _, tok := range []string{acmeAgent, tenant.Credential("acme", "app", "wrong"), tenant.Credential("gamma", "app", "acme-app-secret"), "hmt_acme.app"} {
			f, ci := e.helloRefused(t, tok, "tel-9")
			if f.Str("code") != "auth_failed" || ci.Code != protocol.CloseCode {
				t.Errorf("hello with %q: %s, close %v; want auth_failed, %d", tok, f, ci, protocol.CloseCode)
			}
		}
		wantError(t, e.call(t, "GET", "/v1/events?format=json", tenant.Credential("acme", "hermes", "wrong"), nil), http.StatusUnauthorized, "auth_failed")
		wantError(t, e.call(t, "GET", "/v1/events?format=json", acmeCron, nil), http.StatusForbidden, "forbidden")
		wantError(t, e.call(t, "POST", "/v1/deliver", acmeAgent, map[string]any{"target": "tel-1", "text": "x"}), http.StatusForbidden, "forbidden")
		wantError(t, e.call(t, "POST", "/v1/deliver", acmeApp, map[string]any{"target": "tel-1", "text": "x"}), http.StatusForbidden, "forbidden")
	})

	t.Run("each agent reads only its own owner's events and files", func(t *testing.T) {
		// Where each log reader starts: after everything so far.
		start := map[string]string{}
		for _, tok := range []string{acmeAgent, betaAgent, agentToken} {
			start[tok] = e.cursorAs(t, tok)
		}
		audio := []byte("OggS acme's voice")
		if err := acme.Audio("a-1", "ogg", audio, ""); err != nil {
			t.Fatal(err)
		}
		if err := beta.Text("b-1", "beta says"); err != nil {
			t.Fatal(err)
		}
		if err := legacy.Text("l-1", "legacy says"); err != nil {
			t.Fatal(err)
		}
		if err := acme.Text("a-2", "acme says"); err != nil {
			t.Fatal(err)
		}
		got := map[string][]loggedEvent{}
		for _, tok := range []string{acmeAgent, betaAgent, agentToken} {
			want := map[string]int{acmeAgent: 2, betaAgent: 1, agentToken: 1}[tok]
			got[tok] = e.waitEventsAs(t, tok, start[tok], want)
		}
		for tok, want := range map[string][]string{acmeAgent: {"a-1", "a-2"}, betaAgent: {"b-1"}, agentToken: {"l-1"}} {
			es := got[tok]
			var ids []string
			for _, ev := range es {
				ids = append(ids, ev.Event.ID)
				if ev.Event.Device != "tel-1" || ev.Event.Session != "mobile:tel-1" {
					t.Errorf("an event of %s names device %q session %q, want tel-1", ev.Event.ID, ev.Event.Device, ev.Event.Session)
				}
			}
			if strings.Join(ids, ",") != strings.Join(want, ",") {
				t.Errorf("an agent read events %v, want %v", ids, want)
			}
		}
		// Nothing more for anyone: a read after the last is empty.
		for tok, es := range got {
			if more := e.eventsAs(t, tok, "cursor="+es[len(es)-1].Cursor+"&max=10"); len(more) != 0 {
				t.Errorf("an agent read more than its own: %+v", more)
			}
		}
		blob := got[acmeAgent][0].Event.Media.Blob
		if r := e.call(t, "GET", "/v1/blobs/"+blob, acmeAgent, nil); r.status != http.StatusOK || string(r.body) != string(audio) {
			t.Errorf("acme's agent reading its file: %d %q", r.status, r.body)
		}
		for _, tok := range []string{betaAgent, agentToken} {
			wantError(t, e.call(t, "GET", "/v1/blobs/"+blob, tok, nil), http.StatusNotFound, "not_found")
		}
		_, raw, _ := strings.Cut(blob, "~")
		wantError(t, e.call(t, "GET", "/v1/blobs/beta~"+raw, betaAgent, nil), http.StatusNotFound, "not_found")
		wantError(t, e.call(t, "GET", "/v1/blobs/"+raw, agentToken, nil), http.StatusNotFound, "not_found")
		// Nor may beta's agent send acme's file to its own phone.
		wantError(t, e.call(t, "POST", "/v1/sessions/tel-1/media", betaAgent, map[string]any{"kind": "voice", "blob": blob}),
			http.StatusBadRequest, "bad_frame")
	})

	t.Run("a withdrawn key closes its phones; a new key admits one; nobody else notices", func(t *testing.T) {
		withApp2 := strings.Replace(acmeKeysAll, `      - {id: app,`, `      - {id: app2, kind: app, secret: acme-app2-secret}
      - {id: app,`, 1)
		writeTenants(t, path, tenantsFile(withApp2))
		testsvc.WaitFor(t, 5*time.Second, "acme's new app key to admit a phone", func() bool {
			c, err := client.Dial(ctxFor(t, 5*time.Second), e.node.URL(), client.Options{Timeout: 5 * time.Second})
			if err != nil {
				return false
			}
			defer c.CloseNow()
			_, err = c.Hello(ctxFor(t, 5*time.Second), acmeApp2, protocol.Device{ID: "tel-5"}, protocol.User{})
			return err == nil
		})
		a5 := e.phoneAs(t, acmeApp2, "tel-5")
		// Withdraw the first app key: acme's phones of it close within 5 s.
		writeTenants(t, path, tenantsFile(strings.Replace(withApp2, "      - {id: app, kind: app, secret_sha256: \""+tenant.SecretSHA256("acme-app-secret")+"\"}\n", "", 1)))
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		f, err := acme.Expect(ctx, "error")
		if err != nil || f.Str("code") != "auth_failed" {
			t.Fatalf("acme's phone of the withdrawn key: %s, %v; want auth_failed within 5 s", f, err)
		}
		ci, err := acme.ExpectClose(ctx)
		if err != nil || ci.Code != protocol.CloseCode {
			t.Fatalf("acme's phone of the withdrawn key: close %v, %v; want %d", ci, err, protocol.CloseCode)
		}
		f, ci = e.helloRefused(t, acmeApp, "tel-1")
		if f.Str("code") != "auth_failed" || ci.Code != protocol.CloseCode {
			t.Errorf("a hello with the withdrawn key: %s, close %v", f, ci)
		}
		// The others are still connected and served.
		for _, c := range []struct {
			token string
			to    *client.Conn
		}{{betaCron, beta}, {deliverToken, legacy}, {acmeCron, a5}} {
			text := "still " + testsvc.RandomHex(4)
			target := "tel-1"
			if c.to == a5 {
				target = "tel-5"
			}
			wantOK(t, e.call(t, "POST", "/v1/deliver", c.token, map[string]any{"target": target, "text": text}))
			expectText(t, c.to, text)
		}
		// Each agent's event stream shows its own, with plain ids.
		bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }
		acmeStream := e.openStream(t, "cursor="+e.cursorAs(t, acmeAgent), bearer(acmeAgent))
		betaStream := e.openStream(t, "cursor="+e.cursorAs(t, betaAgent), bearer(betaAgent))
		if err := beta.Text("b-2", "beta streams"); err != nil {
			t.Fatal(err)
		}
		if err := a5.Text("a5-1", "acme streams"); err != nil {
			t.Fatal(err)
		}
		if _, ev := acmeStream.next(t); ev.ID != "a5-1" || ev.Device != "tel-5" || ev.Session != "mobile:tel-5" {
			t.Errorf("acme's stream: %+v, want a5-1 of tel-5", ev)
		}
		if _, ev := betaStream.next(t); ev.ID != "b-2" || ev.Device != "tel-1" {
			t.Errorf("beta's stream: %+v, want b-2 of tel-1", ev)
		}
		// A withdrawn agent key: its next request is refused, and its
		// stream ends.
		writeTenants(t, path, tenantsFile(strings.Replace(withApp2, "      - {id: hermes, kind: agent, secret: acme-agent-secret}\n", "", 1)))
		testsvc.WaitFor(t, 5*time.Second, "acme's withdrawn agent key to be refused", func() bool {
			return e.call(t, "GET", "/v1/events?format=json", acmeAgent, nil).status == http.StatusUnauthorized
		})
		select {
		case ev, ok := <-acmeStream.events:
			if ok {
				t.Errorf("acme's stream of a withdrawn key got %+v, want its end", ev)
			}
		case <-time.After(5 * time.Second): // the bound under test: keep-alive is 300 ms here
			t.Error("acme's stream of a withdrawn key did not end within 5 s")
		}
		wantOK(t, e.call(t, "POST", "/v1/sessions/tel-1/messages", betaAgent, map[string]any{"text": "beta's agent still works"}))
		expectText(t, beta, "beta's agent still works")
		if err := beta.Text("b-3", "beta still streams"); err != nil {
			t.Fatal(err)
		}
		if _, ev := betaStream.next(t); ev.ID != "b-3" {
			t.Errorf("beta's stream after acme's key went: %+v, want b-3", ev)
		}
	})
}

// wantOK202 checks a 202 {"ok":true,"queued":true} answer.
func wantOK202(t *testing.T, r response) {
	t.Helper()
	if r.status != http.StatusAccepted || r.json(t)["queued"] != true {
		t.Fatalf("status %d %s, want 202 queued", r.status, r.body)
	}
}

// eventsAs is one JSON read of the event log with token.
func (e *env) eventsAs(t *testing.T, token, query string) []loggedEvent {
	t.Helper()
	es, _ := e.eventsCursorAs(t, token, query)
	return es
}

func (e *env) eventsCursorAs(t *testing.T, token, query string) ([]loggedEvent, string) {
	t.Helper()
	r := e.call(t, "GET", "/v1/events?format=json&"+query, token, nil)
	if r.status != http.StatusOK {
		t.Fatalf("GET /v1/events?%s: %d %s", query, r.status, r.body)
	}
	var body struct {
		Events []loggedEvent `json:"events"`
		Cursor string        `json:"cursor"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("GET /v1/events: %v: %s", err, r.body)
	}
	return body.Events, body.Cursor
}

// cursorAs is the cursor after every entry token's owner can read now.
func (e *env) cursorAs(t *testing.T, token string) string {
	t.Helper()
	cursor := ""
	for {
		es, next := e.eventsCursorAs(t, token, "max=1000&cursor="+cursor)
		if len(es) == 0 {
			return next
		}
		cursor = next
	}
}

// waitEventsAs reads the log with token after cursor until n events came.
func (e *env) waitEventsAs(t *testing.T, token, cursor string, n int) []loggedEvent {
	t.Helper()
	var got []loggedEvent
	testsvc.WaitFor(t, 15*time.Second, "the events", func() bool {
		es, next := e.eventsCursorAs(t, token, "wait=1&max=100&cursor="+cursor)
		got, cursor = append(got, es...), next
		return len(got) >= n
	})
	return got
}
