package router_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// benchTraces are the tracing set-ups the API benchmarks compare: none
// (no OTLP endpoint: the no-op tracer), and spans recorded by the SDK and
// handed to a batch processor whose exporter drops them, for a caller
// without and with a traceparent.
var benchTraces = []struct {
	name        string
	traced      bool
	traceparent string
}{
	{"untraced", false, ""},
	{"traced", true, ""},
	{"traced-caller", true, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
}

// benchNode starts a single node with a router and its API, traced or not.
func benchNode(b *testing.B, traced bool) *gateway.Gateway {
	b.Helper()
	var tel *telemetry.Telemetry
	if traced {
		var err error
		tel, err = telemetry.New(context.Background(), telemetry.Config{ServiceName: "bench",
			SpanProcessor: sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { tel.Shutdown(context.Background()) })
	}
	return benchNodeWith(b, tel)
}

// benchNodeWith starts a single node with a router and its API, recording
// to tel (nil: nothing).
func benchNodeWith(b *testing.B, tel *telemetry.Telemetry) *gateway.Gateway {
	b.Helper()
	nc := nodeConfig()
	nc.Router, nc.APIListen, nc.API, nc.Telemetry = true, "127.0.0.1:0", apiConfig(nil), tel
	g, err := gateway.Start(context.Background(), nc, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	return g
}

// BenchmarkAPIDeliver is POST /v1/deliver through the API's handler (no
// HTTP client or socket on the caller's side): the decode, the owner read,
// the bus request to the node's edge, the write to a phone's socket and
// the answer, untraced and traced.
func BenchmarkAPIDeliver(b *testing.B) {
	for _, tc := range benchTraces {
		b.Run(tc.name, func(b *testing.B) {
			g := benchNode(b, tc.traced)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			phone, err := client.Dial(ctx, g.URL(), client.Options{Timeout: 5 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer phone.CloseNow()
			if _, err := phone.Hello(ctx, phoneToken, protocol.Device{ID: "bench-1"}, protocol.User{ID: "u"}); err != nil {
				b.Fatal(err)
			}
			go func() { // the phone reads what it gets
				for {
					if _, err := phone.Next(ctx); err != nil {
						return
					}
				}
			}()
			body := []byte(`{"target":"bench-1","text":"Standup in 5"}`)
			serve := func() int {
				req := httptest.NewRequest("POST", "/v1/deliver", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+deliverToken)
				if tc.traceparent != "" {
					req.Header.Set("traceparent", tc.traceparent)
				}
				w := httptest.NewRecorder()
				g.API.ServeHTTP(w, req)
				return w.Code
			}
			for range 3 { // the owner record, the subscriptions
				if code := serve(); code != http.StatusOK {
					b.Fatalf("deliver: %d", code)
				}
			}
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				if code := serve(); code != http.StatusOK {
					b.Fatalf("deliver: %d", code)
				}
			}
			reportCPU(b, cpu)
		})
	}
}

// BenchmarkAPIDeliverConcurrent is POST /v1/deliver from many callers at
// once, each to a phone of its own among 64 on the node's edge, as cron
// jobs and agents that overlap send them: the deliveries that meet at the
// edge's subject while one is in flight go together (docs/performance.md).
//
// It reports the deliveries each bus request to the edge carried
// (deliveries/request): 1 when none overlap.
func BenchmarkAPIDeliverConcurrent(b *testing.B) {
	const phones = 64
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "bench"}) // metrics only
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tel.Shutdown(context.Background()) })
	metrics := httptest.NewServer(tel.Handler())
	b.Cleanup(metrics.Close)
	requests := func() float64 {
		m := testsvc.Scrape(b, metrics.URL+"/metrics")
		return m[aloneRequests] + m[groupRequests]
	}
	g := benchNodeWith(b, tel)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := range phones {
		phone, err := client.Dial(ctx, g.URL(), client.Options{Timeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		defer phone.CloseNow()
		if _, err := phone.Hello(ctx, phoneToken, protocol.Device{ID: fmt.Sprintf("bench-%d", i)}, protocol.User{ID: "u"}); err != nil {
			b.Fatal(err)
		}
		go func() { // the phone reads what it gets
			for {
				if _, err := phone.Next(ctx); err != nil {
					return
				}
			}
		}()
	}
	serve := func(body []byte) int {
		req := httptest.NewRequest("POST", "/v1/deliver", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+deliverToken)
		w := httptest.NewRecorder()
		g.API.ServeHTTP(w, req)
		return w.Code
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(phones / runtime.GOMAXPROCS(0))
	sent := requests()
	cpu := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		body := []byte(fmt.Sprintf(`{"target":"bench-%d","text":"Standup in 5"}`, next.Add(1)%phones))
		for pb.Next() {
			if code := serve(body); code != http.StatusOK {
				b.Errorf("deliver: %d", code)
				return
			}
		}
	})
	reportCPU(b, cpu)
	b.ReportMetric(float64(b.N)/(requests()-sent), "deliveries/request")
}

// cpuTime is the CPU time this process has used so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time since since per operation
// (cpu-ns/op): the phones', the edge's, the bus's and the router's, which
// a benchmark of concurrent callers' ns/op (wall time) does not show.
func reportCPU(b *testing.B, since time.Duration) {
	b.ReportMetric(float64(cpuTime()-since)/float64(b.N), "cpu-ns/op")
}

// BenchmarkAPIHealthz is GET /healthz through the API's handler: the
// API's own work around an endpoint that does next to nothing (the access
// check, the metrics, the log line and, traced, the server span).
func BenchmarkAPIHealthz(b *testing.B) {
	for _, tc := range benchTraces {
		b.Run(tc.name, func(b *testing.B) {
			g := benchNode(b, tc.traced)
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest("GET", "/healthz", nil)
				if tc.traceparent != "" {
					req.Header.Set("traceparent", tc.traceparent)
				}
				w := httptest.NewRecorder()
				g.API.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("healthz: %d", w.Code)
				}
			}
		})
	}
}

// BenchmarkHello is a phone's hello on a single node, from the dial to
// its ready, then its close: the token check (an owner's key of a
// tenants file, and a token of the environment), the ownership claim, the
// subscription and the counting of the owner's socket.
func BenchmarkHello(b *testing.B) {
	path := filepath.Join(b.TempDir(), "tenants.yaml")
	if err := os.WriteFile(path, []byte(tenantsFile(acmeKeysAll)), 0o600); err != nil {
		b.Fatal(err)
	}
	reg, err := tenant.Open(tenant.Options{Path: path})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, token string }{{"owner", acmeApp}, {"legacy", phoneToken}} {
		b.Run(tc.name, func(b *testing.B) {
			nc := nodeConfig()
			nc.Tenants = reg
			g, err := gateway.Start(context.Background(), nc, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { g.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			b.ReportAllocs()
			for b.Loop() {
				phone, err := client.Dial(ctx, g.URL(), client.Options{Timeout: 5 * time.Second})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := phone.Hello(ctx, tc.token, protocol.Device{ID: "bench-1"}, protocol.User{ID: "u"}); err != nil {
					b.Fatal(err)
				}
				phone.CloseNow()
			}
		})
	}
}
