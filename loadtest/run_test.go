package main

// Real runs against an in-process node (pkg/gateway: embedded NATS, memory
// store, router with the demo agent) over loopback sockets.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

const (
	testToken   = "lt-token"
	testDeliver = "lt-deliver"
)

// node is a running gateway; stop closes it once (Gateway.Close may not be
// called twice).
type node struct {
	*gateway.Gateway
	stop func() error
}

// startNode starts a single node with the router's API; a non-nil a
// replaces the demo agent.
func startNode(t *testing.T, a agent.Agent) node {
	t.Helper()
	g, err := gateway.Start(context.Background(), gateway.Config{
		Listen:    "127.0.0.1:0",
		Router:    true,
		Agent:     a,
		APIListen: "127.0.0.1:0",
		API:       router.APIConfig{DeliverTokens: []string{testDeliver}},
		Edge:      edge.Config{Auth: edge.AuthConfig{Token: testToken}},
	}, nil)
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	n := node{Gateway: g, stop: sync.OnceValue(g.Close)}
	t.Cleanup(func() { n.stop() })
	return n
}

func testConfig(g node, conns int) Config {
	return Config{
		URLs: []string{g.URL()}, Token: testToken, Conns: conns, RunID: "t" + randomHex(2),
		Soak: 300 * time.Millisecond, Duration: 2 * time.Second, Rate: 100, AnswerWait: 10 * time.Second,
		DialConcurrency: 50, Sources: sourceCount,
	}
}

func TestShortRealRun(t *testing.T) {
	g := startNode(t, nil)
	cfg := testConfig(g, 200)
	cfg.Storm = 0.5
	cfg.DeliverURL, cfg.DeliverToken, cfg.DeliverRate = g.APIURL(), testDeliver, 20
	cfg.Progress = 500 * time.Millisecond
	var progress bytes.Buffer
	rep, err := run(context.Background(), cfg, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), " progress ") || !strings.Contains(progress.String(), "held=200") {
		t.Errorf("no progress line with the 200 phones held in the 2 s message phase:\n%s", progress.String())
	}
	var table bytes.Buffer
	rep.WriteTable(&table)
	t.Logf("\n%s\n%s", progress.String(), table.String())

	if !rep.OK {
		t.Errorf("the run failed: %v", rep.Failures)
	}
	if c := rep.Connect; c.Wanted != 200 || c.Held != 200 || c.Failed != 0 || c.Rate <= 0 || c.Handshake.Count() != 200 {
		t.Errorf("connect: %+v, want 200 held, 200 handshakes timed", c)
	}
	m := rep.Messages
	if m.Sent != 200 || m.Answered != 200 || m.Lost != 0 || m.Latency.Count() != 200 {
		t.Errorf("messages: sent %d answered %d lost %d timed %d; want 100/s for 2 s, all answered", m.Sent, m.Answered, m.Lost, m.Latency.Count())
	}
	if p := m.Latency.Percentile(0.5); p <= 0 || p > 10*time.Second {
		t.Errorf("message p50 %v is not a round trip", p)
	}
	if d := rep.Deliveries; d.Sent != 40 || d.Received != 40 || d.Lost != 0 || d.Latency.Count() != 40 {
		t.Errorf("deliveries: sent %d received %d lost %d timed %d; want 40 each and none lost", d.Sent, d.Received, d.Lost, d.Latency.Count())
	}
	if s := rep.Storm; s.Dropped != 100 || s.Back != 100 || s.Seconds <= 0 || s.Handshake.Count() != 100 {
		t.Errorf("storm: %+v, want 100 dropped and back", s)
	}
	if s := rep.Storm; s.Sent != 100 || s.Answered != 100 || s.Lost != 0 || s.Latency.Count() != 100 {
		t.Errorf("texts after the storm: sent %d answered %d lost %d timed %d; want one on each of the 100", s.Sent, s.Answered, s.Lost, s.Latency.Count())
	}
	if rep.Held != 200 || len(rep.Errors) != 0 {
		t.Errorf("held at the end %d, errors %v; want 200 and none", rep.Held, rep.Errors)
	}
}

func TestConnectionsComeFromManySourceAddresses(t *testing.T) {
	g := startNode(t, nil)
	cfg := testConfig(g, 5)
	r := newRunner(cfg, &bytes.Buffer{})
	ok, _ := r.connectAll(context.Background(), r.devs, new(Histogram))
	if ok != 5 {
		t.Fatalf("%d of 5 connected: %v", ok, r.errs.snapshot())
	}
	for i, d := range r.devs {
		ip := d.link.Load().c.LocalAddr().(*net.TCPAddr).IP.String()
		if want := fmt.Sprintf("127.0.0.%d", 2+i); ip != want {
			t.Errorf("device %d came from %s, want %s", i, ip, want)
		}
	}
	r.closeAll()
	if n := r.held(); n != 0 || len(r.errs.snapshot()) != 0 {
		t.Errorf("after closing: %d held, errors %v; want 0 and none", n, r.errs.snapshot())
	}
}

func TestWrongTokenFailsEveryConnection(t *testing.T) {
	g := startNode(t, nil)
	cfg := testConfig(g, 20)
	cfg.Token = "wrong"
	cfg.Soak, cfg.Duration = 0, 0
	var out, errOut bytes.Buffer
	rep, err := run(context.Background(), cfg, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.Connect.Failed != 20 || rep.Errors["error:auth_failed"] != 20 {
		t.Errorf("OK %v, failed %d, errors %v; want a failure with 20 auth_failed", rep.OK, rep.Connect.Failed, rep.Errors)
	}
	if code := finish(rep, "", &out, &errOut); code != exitFailed {
		t.Errorf("exit status %d, want %d", code, exitFailed)
	}
	if !strings.Contains(out.String(), "error:auth_failed: 20") || !strings.Contains(out.String(), "FAIL") {
		t.Errorf("table:\n%s", out.String())
	}
}

// silent is an agent that never answers.
type silent struct{}

func (silent) Handle(context.Context, wire.Event, agent.Output) error { return nil }

func TestUnansweredMessagesAreLost(t *testing.T) {
	g := startNode(t, silent{})
	cfg := testConfig(g, 10)
	cfg.Duration, cfg.Rate, cfg.AnswerWait = time.Second, 20, 500*time.Millisecond
	rep, err := run(context.Background(), cfg, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if m := rep.Messages; rep.OK || m.Sent != 20 || m.Answered != 0 || m.Lost != 20 {
		t.Errorf("OK %v, sent %d, answered %d, lost %d; want a failure with all 20 lost", rep.OK, m.Sent, m.Answered, m.Lost)
	}
}

func TestServerClosesAreCountedByCode(t *testing.T) {
	g := startNode(t, nil)
	r := newRunner(testConfig(g, 20), &bytes.Buffer{})
	if ok, _ := r.connectAll(context.Background(), r.devs, new(Histogram)); ok != 20 {
		t.Fatalf("%d of 20 connected: %v", ok, r.errs.snapshot())
	}
	g.stop()                                                                 // the edge closes every socket with 1001
	testsvc.Eventually(10*time.Second, func() bool { return r.held() == 0 }) // judged below
	r.closeAll()
	if errs := r.errs.snapshot(); errs["close:1001"] != 20 || len(errs) != 1 || r.held() != 0 {
		t.Errorf("errors %v, held %d; want close:1001 = 20 and nothing held", errs, r.held())
	}
}
