package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestRunServesMetrics: the router's admin port serves /metrics with the
// runtime collectors and the router's own metrics, which move when the
// demo agent answers a phone on an edge of the same cluster.
func TestRunServesMetrics(t *testing.T) {
	clearEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_SERVICE_NAME", "")
	rurl := testsvc.RedisURL(t)
	nurl := testsvc.NATSURL(t)
	prefix := uniquePrefix(t, rurl)
	subjects := "rt" + strings.Trim(strings.TrimPrefix(prefix, "hermes-routermain"), ":") + "."
	f := mustParse(t, "-listen=127.0.0.1:0", "-nats-url="+nurl, "-nats-prefix="+subjects, "-redis-url="+rurl,
		"-redis-prefix="+prefix, "-admin-listen=127.0.0.1:0")
	_, logs, _ := runRouter(t, f)
	admin := testsvc.ListeningURL(t, logs.String(), "admin listening")

	node, err := gateway.Start(context.Background(), gateway.Config{
		Listen: "127.0.0.1:0", NATSURL: nurl, NATSPrefix: subjects, RedisURL: rurl, RedisPrefix: prefix,
		Edge: edge.Config{Auth: edge.AuthConfig{Token: "phone-token"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	ctx := ctxFor(t, 15*time.Second)
	phone, err := client.Dial(ctx, node.URL(), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer phone.CloseNow()
	if _, err := phone.Hello(ctx, "phone-token", protocol.Device{ID: "tel-1"}, protocol.User{ID: "u-1"}); err != nil {
		t.Fatal(err)
	}
	if err := phone.Text("m-1", "hi"); err != nil {
		t.Fatal(err)
	}
	if _, err := phone.Expect(ctx, protocol.TypeMessage); err != nil {
		t.Fatal(err)
	}

	var body string
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get(admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics on the admin port: %s", resp.Status)
		}
		body = string(b)
		if strings.Contains(body, "hermes_delivery_latency_seconds_count") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{
		"hermes_delivery_latency_seconds_count ",
		"go_goroutines ",
		"process_resident_memory_bytes ",
		`service_name="hermes-router"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "hermes_delivery_latency_seconds_count 0") {
		t.Error("the router delivered an answer but counted no delivery")
	}
}
