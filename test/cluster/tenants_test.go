//go:build unix

package cluster

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// writeTenantsFile replaces path's content as a deploy does: written
// beside it and renamed over it.
func writeTenantsFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".new", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// helloWith dials edge and says hello as dev with token.
func (c *cluster) helloWith(t *testing.T, edge, token, dev string) (*client.Conn, error) {
	t.Helper()
	conn := c.dial(t, edge)
	_, err := conn.Hello(testCtx(t), token, device(dev), user)
	return conn, err
}

// TestOwnersAcrossEdges: two owners of one tenants file, read by every
// process of the cluster. Their tel-1 are online at once on different
// edges; each one's demo answers, cron and agent reach only its own
// phone; a key withdrawn from the file closes its phone on the other
// edge within 5 s, and a key added admits one, with no restart.
func TestOwnersAcrossEdges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	file := func(betaKeys string) string {
		return `tenants:
  - id: acme
    keys:
      - {id: app, kind: app, secret: acme-app}
      - {id: cron, kind: deliver, secret: acme-cron}
      - {id: hermes, kind: agent, secret: acme-agent}
  - id: beta
    keys:
      - {id: cron, kind: deliver, secret: beta-cron}
` + betaKeys
	}
	writeTenantsFile(t, path, file("      - {id: app, kind: app, secret: beta-app}\n"))
	c := newCluster(t, options{env: []string{"MOBILE_TENANTS_FILE=" + path}})

	acme, err := c.helloWith(t, "A", tenant.Credential("acme", "app", "acme-app"), "tel-1")
	if err != nil {
		t.Fatal(err)
	}
	beta, err := c.helloWith(t, "B", tenant.Credential("beta", "app", "beta-app"), "tel-1")
	if err != nil {
		t.Fatal(err)
	}
	c.waitReachable(t, tenant.DeviceKey("acme", "tel-1"))
	c.waitReachable(t, tenant.DeviceKey("beta", "tel-1"))

	// The demo agent answers each phone, and only it.
	if err := acme.Text("a-1", "acme here"); err != nil {
		t.Fatal(err)
	}
	if err := beta.Text("b-1", "beta here"); err != nil {
		t.Fatal(err)
	}
	for conn, want := range map[*client.Conn]string{acme: "You said: acme here", beta: "You said: beta here"} {
		for _, m := range messages(readUntil(t, conn, want, finalText(want))) {
			if m.text != want && m.text != "You said: " && !strings.HasPrefix(want, m.text) {
				t.Errorf("a phone got %q, which is not its own answer %q", m.text, want)
			}
		}
	}

	// Cron and the agent of each owner reach its own phone only: a
	// phone's next message is its own owner's.
	deliver := func(token, text string) {
		t.Helper()
		code, body := c.post(t, "/v1/deliver", token, map[string]any{"target": "mobile:tel-1", "text": text})
		if code != http.StatusOK || body["ok"] != true {
			t.Fatalf("deliver %q: %d %v", text, code, body)
		}
	}
	deliver(tenant.Credential("beta", "cron", "beta-cron"), "for beta")
	deliver(tenant.Credential("acme", "cron", "acme-cron"), "for acme")
	readUntil(t, acme, "acme's delivery", finalText("for acme"))
	readUntil(t, beta, "beta's delivery", finalText("for beta"))
	if code, body := c.post(t, "/v1/sessions/mobile:tel-1/messages", tenant.Credential("acme", "hermes", "acme-agent"),
		agentMessage{Text: "acme's agent", Final: true}); code != http.StatusOK {
		t.Fatalf("acme's agent: %d %v", code, body)
	}
	for _, m := range messages(readUntil(t, acme, "acme's agent message", finalText("acme's agent"))) {
		if m.text != "acme's agent" {
			t.Errorf("acme's phone got %q before its agent's message", m.text)
		}
	}
	// The legacy owner's tokens still work beside the file, and reach
	// none of the owners' tel-1.
	if code, _ := c.deliver(t, "tel-1", "l-1", "legacy"); code != http.StatusNotFound {
		t.Errorf("the legacy owner's deliver to its own offline tel-1: %d, want 404", code)
	}

	// Withdraw beta's app key: its phone on edge B closes within 5 s with
	// auth_failed; acme's on edge A notices nothing.
	writeTenantsFile(t, path, file(""))
	f, err := beta.Expect(within(t, 5*time.Second), "error")
	if err != nil || f.Str("code") != string(protocol.CodeAuthFailed) {
		t.Fatalf("beta's phone after its key was withdrawn: %s, %v; want auth_failed within 5 s", f, err)
	}
	expectClose(t, beta, 5*time.Second, protocol.CloseCode)
	deliver(tenant.Credential("acme", "cron", "acme-cron"), "acme still here")
	readUntil(t, acme, "acme's delivery after beta's key went", finalText("acme still here"))
	// Edge A reads the file on its own second.
	testsvc.WaitFor(t, 5*time.Second, "edge A to refuse beta's withdrawn key", func() bool {
		conn, err := client.Dial(testCtx(t), c.edge("A").url, client.Options{Timeout: 5 * time.Second})
		if err != nil {
			return false
		}
		defer conn.CloseNow()
		_, err = conn.Hello(testCtx(t), tenant.Credential("beta", "app", "beta-app"), device("tel-1"), user)
		var se *client.ServerError
		return errors.As(err, &se) && se.Code == protocol.CodeAuthFailed
	})

	// A new key for beta admits its phone on every edge, once the file
	// has it: edge C, started meanwhile, serves its metrics too.
	_, admin := startAdminEdge(t, c, "C")
	const okSample, errSample = `hermes_tenants_reloads_total{result="ok"}`, `hermes_tenants_reloads_total{result="error"}`
	if m := testsvc.Scrape(t, admin+"/metrics"); m[okSample] != 0 || m[errSample] != 0 {
		t.Fatalf("a fresh edge's reloads: ok %v, error %v; want both at 0", m[okSample], m[errSample])
	}
	good := file("      - {id: app2, kind: app, secret: beta-app2}\n")
	writeTenantsFile(t, path, good)
	for _, edge := range []string{"A", "B", "C"} {
		testsvc.WaitFor(t, 5*time.Second, "beta's new key on edge "+edge, func() bool {
			conn, err := client.Dial(testCtx(t), c.edge(edge).url, client.Options{Timeout: 5 * time.Second})
			if err != nil {
				return false
			}
			defer conn.CloseNow()
			_, err = conn.Hello(testCtx(t), tenant.Credential("beta", "app2", "beta-app2"), device("tel-7"), user)
			return err == nil
		})
	}
	testsvc.WaitMetric(t, 5*time.Second, admin+"/metrics", okSample, testsvc.Equals(1))

	// A file that does not parse: every edge keeps the last good one, and
	// counts it once; SIGHUP reads it again and counts it again.
	writeTenantsFile(t, path, strings.Replace(good, "kind: app,", "kind: app, colour: red,", 1))
	testsvc.WaitMetric(t, 5*time.Second, admin+"/metrics", errSample, testsvc.Equals(1))
	if _, err := c.helloWith(t, "C", tenant.Credential("beta", "app2", "beta-app2"), "tel-8"); err != nil {
		t.Fatalf("a key of the last good file after a bad one: %v", err)
	}
	hup := c.edge("C").Watch(logMsg("SIGHUP: reading the tenants file again"))
	c.edge("C").Signal(t, syscall.SIGHUP)
	testsvc.WaitChan(t, 5*time.Second, "edge C to log the SIGHUP", hup)
	testsvc.WaitMetric(t, 5*time.Second, admin+"/metrics", errSample, testsvc.Equals(2))
	if !strings.Contains(c.edge("C").LastLines(), `line 4: a key has an unknown field \"colour\"`) {
		t.Errorf("edge C's log does not name the bad line: %s", c.edge("C").LastLines())
	}
}
