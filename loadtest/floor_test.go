package main

// The floor over real loopback sockets, spoken to with the same client the
// load generator uses.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func startTestFloor(t *testing.T) *floorServer {
	t.Helper()
	f, err := startFloor("127.0.0.1:0", testToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if !strings.HasPrefix(f.URL(), "ws://127.0.0.1:") || !strings.HasSuffix(f.URL(), "/ws") {
		t.Fatalf("URL() = %q", f.URL())
	}
	return f
}

func dialFloor(t *testing.T, f *floorServer) *client.Conn {
	t.Helper()
	c, err := client.Dial(testCtx(t), f.URL(), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func TestFloorHelloReadyPingPong(t *testing.T) {
	f := startTestFloor(t)
	c := dialFloor(t, f)
	ready, err := c.Hello(testCtx(t), testToken, protocol.Device{ID: "tel-1", Name: "Phone"}, protocol.User{ID: "u"})
	if err != nil {
		t.Fatal(err)
	}
	if ready.Int("v") != protocol.Version || ready.Str("session") != "mobile:tel-1" ||
		ready.Map("device").Str("id") != "tel-1" || ready.Map("device").Str("name") != "Phone" ||
		!ready.Map("capabilities").Bool("text") {
		t.Fatalf("ready = %s", ready)
	}
	// Pongs echo ts, whatever JSON it is, in order, pipelined.
	for _, ts := range []any{"run 1", 12.5, "run 2"} {
		if err := c.Ping(ts); err != nil {
			t.Fatal(err)
		}
	}
	// A frame the floor does not speak is ignored, as the spec says.
	if err := c.Text("m1", "hello"); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping("run 3"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []any{"run 1", 12.5, "run 2", "run 3"} {
		f, err := c.Next(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if f.T() != protocol.TypePong || fmt.Sprint(f.Fields()["ts"]) != fmt.Sprint(want) {
			t.Fatalf("got %s, want a pong with ts %v", f, want)
		}
	}
}

// expectFatal reads an error frame with code, fatal, then a close 1008.
func expectFatal(t *testing.T, c *client.Conn, code protocol.Code) {
	t.Helper()
	f, err := c.Next(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if f.T() != protocol.TypeError || f.Str("code") != string(code) || !f.Bool("fatal") {
		t.Fatalf("got %s, want a fatal error %s", f, code)
	}
	ci, err := c.ExpectClose(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if ci.Code != protocol.CloseCode {
		t.Fatalf("close %d, want %d", ci.Code, protocol.CloseCode)
	}
}

func TestFloorRefusesAWrongTokenAndAFirstFrameOtherThanHello(t *testing.T) {
	f := startTestFloor(t)
	c := dialFloor(t, f)
	_, err := c.Hello(testCtx(t), "wrong", protocol.Device{ID: "tel-1"}, protocol.User{})
	var se *client.ServerError
	if !errors.As(err, &se) || se.Code != protocol.CodeAuthFailed {
		t.Fatalf("hello with a wrong token: %v, want auth_failed", err)
	}
	if _, err := c.ExpectClose(testCtx(t)); err != nil {
		t.Fatalf("after auth_failed: %v, want a close", err)
	}

	c = dialFloor(t, f)
	if err := c.Ping("early"); err != nil {
		t.Fatal(err)
	}
	expectFatal(t, c, protocol.CodeBadFrame)
}

func TestFloorCloseEndsItsConnections(t *testing.T) {
	f, err := startFloor("127.0.0.1:0", testToken)
	if err != nil {
		t.Fatal(err)
	}
	c := dialFloor(t, f)
	if _, err := c.Hello(testCtx(t), testToken, protocol.Device{ID: "tel-1"}, protocol.User{}); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	select {
	case <-c.Done():
	case <-testCtx(t).Done():
		t.Fatal("the connection is still open after Close")
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close = %v", err)
	}
	if _, err := client.Dial(testCtx(t), f.URL(), client.Options{Timeout: time.Second}); err == nil {
		t.Fatal("the floor still accepts after Close")
	}
}

func TestFloorStartChecks(t *testing.T) {
	if _, err := startFloor("127.0.0.1:0", ""); err == nil {
		t.Fatal("a floor without a token started")
	}
	if _, err := startFloor("0.0.0.0:0", testToken); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("a floor on 0.0.0.0: %v, want refused", err)
	}
}
