package gateway_test

// The black-box tests of the gateway: a complete node (embedded NATS, memory
// store, router and agent) on a loopback port, driven through pkg/client over
// real sockets. This file holds the harness every test file shares.

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

const testToken = "test-token"

// node is a running gateway with a recording agent in front of the demo.
type node struct {
	*gateway.Gateway
	agent *recorder
}

// startNode starts a single-node gateway on 127.0.0.1:0. mutate adjusts the
// configuration (tokens, timeouts, agent) before start.
func startNode(t testing.TB, mutate func(*gateway.Config)) *node {
	t.Helper()
	rec := &recorder{next: agent.Demo{}}
	cfg := gateway.Config{
		Listen: "127.0.0.1:0",
		Router: true,
		Agent:  rec,
		Edge:   edge.Config{Auth: edge.AuthConfig{Token: testToken}},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	if cfg.Agent != rec {
		rec.next = cfg.Agent
		cfg.Agent = rec
	}
	g, err := gateway.Start(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	t.Cleanup(func() {
		// A node that hangs on shutdown fails its test instead of hanging
		// the whole package (it is left running).
		done := make(chan struct{})
		go func() { g.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("gateway.Close did not return within 10 s: the node hangs on shutdown")
		}
	})
	return &node{Gateway: g, agent: rec}
}

// testLogger writes the node's logs to t.Log, so a failing test shows
// them, until the test ends (testsvc.LogWriter says why not after).
func testLogger(t testing.TB) *slog.Logger { return testsvc.Logger(t) }

// testCtx is a context that ends with the test or after 20 s.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// dial opens a socket to n.
func (n *node) dial(t testing.TB, opts ...client.Options) *client.Conn {
	t.Helper()
	var o client.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	c, err := client.Dial(testCtx(t), n.URL(), o)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// connect dials and says hello as device with the test token.
func (n *node) connect(t testing.TB, device string) (*client.Conn, client.Frame) {
	t.Helper()
	c := n.dial(t)
	ready, err := c.Hello(testCtx(t), testToken, protocol.Device{ID: device, Name: "Phone " + device}, protocol.User{ID: "u-1", Name: "Tester"})
	if err != nil {
		t.Fatalf("hello as %q: %v", device, err)
	}
	return c, ready
}

// recorder is an agent that records every event and then hands it on.
type recorder struct {
	next agent.Agent

	mu     sync.Mutex
	events []wire.Event
	signal chan struct{}
}

func (r *recorder) Handle(ctx context.Context, ev wire.Event, out agent.Output) error {
	r.mu.Lock()
	r.events = append(r.events, ev)
	if r.signal != nil {
		close(r.signal)
		r.signal = nil
	}
	r.mu.Unlock()
	if r.next == nil {
		return nil
	}
	return r.next.Handle(ctx, ev, out)
}

// Events returns a copy of what the agent received so far.
func (r *recorder) Events() []wire.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]wire.Event(nil), r.events...)
}

// waitFor waits until the agent received an event for which match is true,
// and returns it.
func (r *recorder) waitFor(t testing.TB, match func(wire.Event) bool) wire.Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		for _, ev := range r.events {
			if match(ev) {
				r.mu.Unlock()
				return ev
			}
		}
		if r.signal == nil {
			r.signal = make(chan struct{})
		}
		ch := r.signal
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("the agent never received the expected event; got %+v", r.Events())
		}
	}
}

// count returns how many received events match.
func (r *recorder) count(match func(wire.Event) bool) int {
	n := 0
	for _, ev := range r.Events() {
		if match(ev) {
			n++
		}
	}
	return n
}
