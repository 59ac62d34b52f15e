//go:build unix

package cluster

import (
	"encoding/json"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestDrainWithoutCollector runs an edge (a single node, with a phone's
// round trip so there are spans to export) and a router with
// OTEL_EXPORTER_OTLP_ENDPOINT on a loopback port nobody listens on, and
// stops them with SIGTERM: a drain that did its job exits 0, every line the
// process wrote to stderr is JSON, and the failed export is a warning.
func TestDrainWithoutCollector(t *testing.T) {
	closed, err := testsvc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	otel := "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:" + strconv.Itoa(closed)
	prefix := "hermes-otel-test:" + testsvc.RandomHex(6) + ":"
	redis := redisURL(t)
	dropRedisKeys(t, redis, prefix)
	for _, tc := range []struct {
		name, bin, listening string
		env                  []string
	}{
		{"edge", bins.edge, "gateway listening", []string{"MOBILE_LISTEN=127.0.0.1:0", "MOBILE_TOKEN=tok", "MOBILE_DRAIN_WINDOW=1"}},
		{"router", bins.router, "router listening", []string{"MOBILE_ROUTER_LISTEN=127.0.0.1:0",
			"NATS_URL=" + natsURL(t), "REDIS_URL=" + redis, "REDIS_PREFIX=" + prefix}},
	} {
		logs := &logRecorder{t: t}
		env := append([]string{otel, "MOBILE_ADMIN_LISTEN=127.0.0.1:0"}, tc.env...)
		p, url, err := testsvc.Launch(tc.name, tc.bin, nil, env, logs.logf, logMsg(tc.listening))
		if p != nil {
			t.Cleanup(func() { p.Stop(t.Logf) })
		}
		if err != nil {
			t.Fatal(err)
		}
		if tc.name == "edge" {
			ctx := testCtx(t)
			phone, err := client.Dial(ctx, url, client.Options{Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := phone.Hello(ctx, "tok", device("tel-1"), user); err != nil {
				t.Fatal(err)
			}
			if err := phone.Text("m-1", "hi"); err != nil {
				t.Fatal(err)
			}
			if _, err := phone.Expect(ctx, protocol.TypeMessage); err != nil {
				t.Fatal(err)
			}
			phone.Close()
		}
		p.Signal(t, syscall.SIGTERM)
		// The drain window (1 s), then at most telemetry.CloseTimeout (5 s)
		// for the last export.
		select {
		case <-p.Exited():
		case <-time.After(testsvc.Slack(20 * time.Second)):
			t.Fatalf("%s: still running 20 s after SIGTERM", tc.name)
		}
		if p.Err() != nil {
			t.Errorf("%s: a drain with the collector unreachable ended with %v, want exit code 0", tc.name, p.Err())
		}
		warned := false
		for _, line := range logs.all() {
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Errorf("%s: a line of its stderr is not JSON: %q", tc.name, line)
				continue
			}
			msg, _ := rec["msg"].(string)
			if rec["level"] == "WARN" && strings.Contains(msg, "telemetry") && strings.Contains(msg, "export") &&
				strings.Contains(errText(rec), strconv.Itoa(closed)) {
				warned = true
			}
		}
		if !warned {
			t.Errorf("%s: no warning about the failed export to port %d in its log", tc.name, closed)
		}
	}
}

// errText is the err attribute of a log record.
func errText(rec map[string]any) string {
	s, _ := rec["err"].(string)
	return s
}
