package deploy

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// servedMetrics builds and runs an edge (MOBILE_ROUTER=off, as the chart
// runs it) and a router of one cluster on the tests' Redis and NATS, takes
// a phone through a text, its answer and a close, makes a request to the
// router's API, and returns the names of the samples each serves on its
// admin port's /metrics then, by "edge" and "router": every counter and
// gauge, and the histograms the traffic observed (delivery latency, API
// request duration, connection duration).
func servedMetrics(t *testing.T) map[string]map[string]bool {
	t.Helper()
	redisURL, natsURL := testsvc.RedisURL(t), testsvc.NATSURL(t)
	edgeBin, routerBin := testsvc.Build(t, "services/edge"), testsvc.Build(t, "services/router")
	id := testsvc.RandomHex(6)
	const token = "served-metrics-token"
	cluster := []string{"NATS_URL=" + natsURL, "NATS_PREFIX=dm" + id + ".", "REDIS_URL=" + redisURL,
		"REDIS_PREFIX=hermes-deploy:" + id + ":", "MOBILE_ADMIN_LISTEN=127.0.0.1:0", "MOBILE_LOG_LEVEL=info"}
	routerURL, routerAdmin := runService(t, routerBin, "router listening",
		append(cluster, "MOBILE_ROUTER_LISTEN=127.0.0.1:0")...)
	edgeURL, edgeAdmin := runService(t, edgeBin, "gateway listening",
		append(cluster, "MOBILE_LISTEN=127.0.0.1:0", "MOBILE_TOKEN="+token, "MOBILE_ROUTER=off", "MOBILE_DRAIN_WINDOW=1")...)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	phone, err := client.Dial(ctx, edgeURL, client.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer phone.CloseNow()
	if _, err := phone.Hello(ctx, token, protocol.Device{ID: "tel-deploy-" + id}, protocol.User{ID: "u-1"}); err != nil {
		t.Fatal(err)
	}
	if err := phone.Text("m-1", "hi"); err != nil {
		t.Fatal(err)
	}
	if _, err := phone.Expect(ctx, protocol.TypeMessage); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(routerURL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	// The router records a delivery's latency once the edge answers it.
	// The phone stays until then: a socket closed under a write may be
	// answered "moved" (its owner record already gone), and the router
	// then keeps the reply in the outbox instead, recording no latency.
	served := map[string]map[string]bool{}
	await := func(service, admin, name, after string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			served[service] = scrapeNames(t, admin+"/metrics")
			if served[service][name] {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the %s serves no %s after %s", service, name, after)
			}
			time.Sleep(50 * time.Millisecond) // scrape pace
		}
	}
	await("router", routerAdmin, "hermes_delivery_latency_seconds_bucket", "the phone's text was answered")
	phone.Close()
	await("edge", edgeAdmin, "hermes_connection_duration_seconds_bucket", "the phone's close")
	return served
}

// runService starts bin with env until the test ends (SIGTERM, then a
// wait) and returns the url of its listening log line and its admin URL.
func runService(t *testing.T, bin, listening string, env ...string) (url, admin string) {
	t.Helper()
	logs := testsvc.NewBuffer()
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("%s did not stop within 20 s of SIGTERM", filepath.Base(bin))
		}
	})
	deadline := time.After(15 * time.Second)
	for {
		url = testsvc.ListeningURL(t, logs.String(), listening)
		if url != "" {
			return url, testsvc.ListeningURL(t, logs.String(), "admin listening")
		}
		select {
		case <-logs.Written():
		case err := <-exited:
			t.Fatalf("%s exited (%v) before listening:\n%s", filepath.Base(bin), err, logs)
		case <-deadline:
			t.Fatalf("%s logged no %q:\n%s", filepath.Base(bin), listening, logs)
		}
	}
}

// scrapeNames GETs url and returns the names of its samples.
func scrapeNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for key := range testsvc.Scrape(t, url) {
		name, _, _ := strings.Cut(key, "{")
		names[name] = true
	}
	return names
}
