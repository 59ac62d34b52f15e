package gateway_test

// The WebSocket layer against unauthenticated and silent peers: the bound on
// a message before hello, and the keepalive that drops sockets whose phone
// vanished. Framing and close handling are in test/wsconformance.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// paddedHello is a valid hello of exactly size bytes.
func paddedHello(device string, size int) []byte {
	prefix := `{"t":"hello","token":"` + testToken + `","device":{"id":"` + device + `"},"pad":"`
	const suffix = `"}`
	return []byte(prefix + strings.Repeat("a", size-len(prefix)-len(suffix)) + suffix)
}

// TestPreHelloSizeLimit: before hello, a message of exactly
// edge.MaxPreHelloBytes is read; one byte more is a fatal too_big with close
// 1008, decided on the frame header, before any of its payload is read.
func TestPreHelloSizeLimit(t *testing.T) {
	if edge.MaxPreHelloBytes != 8<<10 {
		t.Fatalf("MaxPreHelloBytes = %d, docs/limits.md says 8 KiB", edge.MaxPreHelloBytes)
	}
	n := hsNode(t, nil)

	t.Run("exactly the bound is a hello", func(t *testing.T) {
		c := n.dial(t)
		if err := c.SendRaw(paddedHello("tel-prehello-exact", edge.MaxPreHelloBytes)); err != nil {
			t.Fatal(err)
		}
		if f := hsNext(t, c, "8 KiB hello"); f.T() != protocol.TypeReady {
			t.Fatalf("a hello of exactly 8 KiB was answered with %s, want ready", f)
		}
	})
	t.Run("one byte more is too_big", func(t *testing.T) {
		c := n.dial(t)
		sent := rbSend(func() error { return c.SendRaw(paddedHello("tel-prehello-over", edge.MaxPreHelloBytes+1)) })
		hsExpectFatal(t, c, protocol.CodeTooBig, "8 KiB + 1 before hello")
		<-sent
	})
	t.Run("fragments count together", func(t *testing.T) {
		c := n.dial(t)
		sent := rbSend(func() error { return c.SendFragmented(paddedHello("tel-prehello-frag", edge.MaxPreHelloBytes+1), 3) })
		hsExpectFatal(t, c, protocol.CodeTooBig, "8 KiB + 1 in fragments before hello")
		<-sent
	})
	t.Run("a 16 MiB header is refused before its payload", func(t *testing.T) {
		// A raw socket declares 16 MiB and sends none of it: the answer must
		// come from the header alone, and the edge must not allocate for it.
		nc, _, _, err := ws.Dialer{Timeout: 5 * time.Second}.Dial(testCtx(t), n.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		hdr := ws.Header{Fin: true, OpCode: ws.OpText, Masked: true, Length: protocol.MaxFrameBytes, Mask: [4]byte{1, 2, 3, 4}}
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := ws.WriteHeader(nc, hdr); err != nil {
			t.Fatal(err)
		}
		h, p := readServerFrame(t, nc)
		if h.OpCode != ws.OpText || !strings.Contains(string(p), `"code":"too_big"`) || !strings.Contains(string(p), `"fatal":true`) {
			t.Fatalf("a 16 MiB header before hello was answered with %v %q, want a fatal too_big", h.OpCode, p)
		}
		h, p = readServerFrame(t, nc)
		if h.OpCode != ws.OpClose || len(p) < 2 || binary.BigEndian.Uint16(p) != 1008 || string(p[2:]) != "too_big" {
			t.Fatalf("then %v %q, want close 1008 too_big", h.OpCode, p)
		}
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
			t.Fatalf("the process allocated %d bytes while refusing a 16 MiB header", grew)
		}
	})
	c, _ := n.connect(t, "tel-prehello-after")
	hsEcho(t, c, "prehello-1", "still working")
}

// readServerFrame reads one frame the server sent on a raw socket.
func readServerFrame(t *testing.T, nc net.Conn) (ws.Header, []byte) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	h, err := ws.ReadHeader(nc)
	if err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(nc, p); err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	return h, p
}

// TestKeepalive holds idle sockets for several read timeouts, with the
// defaults' ratios scaled down (ReadTimeout = 2 × PingInterval, three silent
// intervals close a socket): one that never answers the edge's pings is
// closed; one that only answers them, and one that sends its own WebSocket
// ping every two thirds of an interval (OkHttp's 20 s against the edge's
// 30 s), stay open and still work. Neither sends a data frame after hello,
// so only control frames keep them: a read deadline that ran on past a
// control frame cut both after about two read timeouts.
func TestKeepalive(t *testing.T) {
	const interval = 500 * time.Millisecond
	def := edge.DefaultConfig()
	if def.ReadTimeout != 2*def.PingInterval || def.PingMisses != 2 {
		t.Fatalf("defaults changed (ReadTimeout %v, PingInterval %v, PingMisses %d): scale this test's to match",
			def.ReadTimeout, def.PingInterval, def.PingMisses)
	}
	readTimeout := interval * (def.ReadTimeout / def.PingInterval)
	n := hsNode(t, func(cfg *gateway.Config) {
		cfg.Edge.PingInterval = interval
		cfg.Edge.ReadTimeout = readTimeout
	})

	hello := func(r *rbRaw, device string) {
		r.write(ws.OpText, true, []byte(`{"t":"hello","token":"`+testToken+`","device":{"id":"`+device+`"}}`))
		if h, p := r.read(); h.OpCode != ws.OpText || !strings.Contains(string(p), `"t":"ready"`) {
			t.Fatalf("hello answered with %v %q", h.OpCode, p)
		}
	}
	silent := rbDialRaw(t, n)
	hello(silent, "tel-silent")
	answerer := rbDialRaw(t, n)
	hello(answerer, "tel-answerer")
	pinger := rbDialRaw(t, n)
	hello(pinger, "tel-pinger")

	// Both live clients read in the background, answer the edge's pings
	// and report each control frame they get, until the app-level pong
	// that ends the test (or an error).
	type event struct {
		op  ws.OpCode
		err error // set: the socket ended
	}
	listen := func(r *rbRaw) <-chan event {
		events := make(chan event, 1000)
		go func() {
			for {
				r.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
				h, err := ws.ReadHeader(r.br)
				if err != nil {
					events <- event{err: err}
					return
				}
				p := make([]byte, h.Length)
				if _, err := io.ReadFull(r.br, p); err != nil {
					events <- event{err: err}
					return
				}
				if h.OpCode == ws.OpPing {
					// One Write a frame: the pinger's ticker writes too.
					// A deadline of its own: the hello's has passed by now.
					r.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
					if _, err := r.nc.Write(ws.MustCompileFrame(ws.MaskFrame(ws.NewPongFrame(p)))); err != nil {
						events <- event{err: err}
						return
					}
				}
				if h.OpCode == ws.OpText && string(p) != `{"t":"pong","ts":"still"}` {
					events <- event{err: fmt.Errorf("unexpected frame %q", p)}
					return
				}
				events <- event{op: h.OpCode}
				if h.OpCode == ws.OpText {
					return
				}
			}
		}()
		return events
	}
	answered, pinged := listen(answerer), listen(pinger)
	stopPinging := make(chan struct{})
	pingerDone := make(chan struct{})
	go func() {
		defer close(pingerDone)
		tick := time.NewTicker(interval * 2 / 3)
		defer tick.Stop()
		for {
			select {
			case <-stopPinging:
				return
			case <-tick.C:
				pinger.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := pinger.nc.Write(ws.MustCompileFrame(ws.MaskFrame(ws.NewPingFrame([]byte("okhttp"))))); err != nil {
					return
				}
			}
		}
	}()

	// The silent client reads the pings and never answers: the edge closes it.
	silentPings := 0
	for {
		silent.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		h, err := ws.ReadHeader(silent.br)
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
			break
		}
		if err != nil {
			t.Fatalf("the edge never closed a socket that does not answer pings (%d pings): %v", silentPings, err)
		}
		if _, err := io.CopyN(io.Discard, silent.br, h.Length); err != nil {
			break
		}
		if h.OpCode == ws.OpPing {
			silentPings++
		}
	}
	if silentPings == 0 {
		t.Fatal("the silent socket was closed without being pinged")
	}

	// Held for several read timeouts, counted in what the clients saw: the
	// answerer is pinged once per one or two intervals, so five pings span
	// at least two read timeouts past the silent one's end; the pinger's
	// pongs come every two thirds of an interval, twelve of them over
	// four read timeouts.
	wait := func(events <-chan event, op ws.OpCode, want int, who string) {
		t.Helper()
		deadline := time.After(20 * readTimeout)
		for got := 0; got < want; {
			select {
			case e := <-events:
				if e.err != nil {
					t.Fatalf("the %s was cut after %d of the %d frames awaited: %v", who, got, want, e.err)
				}
				if e.op == op {
					got++
				}
			case <-deadline:
				t.Fatalf("the %s got %d of the %d frames awaited in %v", who, got, want, 20*readTimeout)
			}
		}
	}
	wait(answered, ws.OpPing, 5, "socket that only answers pings")
	wait(pinged, ws.OpPong, 12, "socket that sends its own pings")
	close(stopPinging)
	<-pingerDone

	// Both still work.
	for _, c := range []struct {
		r      *rbRaw
		events <-chan event
		who    string
	}{{answerer, answered, "answerer"}, {pinger, pinged, "pinger"}} {
		c.r.write(ws.OpText, true, []byte(`{"t":"ping","ts":"still"}`))
		wait(c.events, ws.OpText, 1, c.who)
	}
	hsWaitConns(t, n, 2)
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && strings.Contains(oe.Err.Error(), "reset")
}

// TestHelloPhaseCaps: with MaxHelloConnsPerAddr sockets from one address
// upgraded and silent, the next upgrade from it gets HTTP 503 and is not
// upgraded; one from another address still is (MaxHelloConns is higher).
// Once one of the silent sockets says hello it no longer counts, and a new
// upgrade from the first address succeeds: phones that said hello never
// hold the cap.
func TestHelloPhaseCaps(t *testing.T) {
	const perAddr = 4
	n := hsNode(t, func(cfg *gateway.Config) {
		cfg.Edge.MaxHelloConnsPerAddr = perAddr
		cfg.Edge.MaxHelloConns = 2 * perAddr
		// No silent socket waits long enough to give its place away.
		cfg.Edge.HelloTimeout = time.Hour
	})
	dial := func(local string) (net.Conn, error) {
		d := ws.Dialer{Timeout: 5 * time.Second, NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
			return nd.DialContext(ctx, network, addr)
		}}
		nc, _, _, err := d.Dial(testCtx(t), n.URL())
		if err == nil {
			t.Cleanup(func() { nc.Close() })
		}
		return nc, err
	}
	var silent []net.Conn
	for i := range perAddr {
		nc, err := dial("127.0.0.1")
		if err != nil {
			t.Fatalf("upgrade %d of %d from one address: %v", i+1, perAddr, err)
		}
		silent = append(silent, nc)
	}
	_, err := dial("127.0.0.1")
	var status ws.StatusError
	if !errors.As(err, &status) || int(status) != http.StatusServiceUnavailable {
		t.Fatalf("upgrade %d from one address: %v, want HTTP 503", perAddr+1, err)
	}
	if _, err := dial("127.0.0.2"); err != nil {
		t.Fatalf("an upgrade from another address while the first is at its cap: %v", err)
	}
	// One silent socket says hello: its address has room again.
	r := &rbRaw{t: t, nc: silent[0], br: bufio.NewReader(silent[0])}
	r.write(ws.OpText, true, []byte(`{"t":"hello","token":"`+testToken+`","device":{"id":"tel-caps"}}`))
	if h, p := r.read(); h.OpCode != ws.OpText || !strings.Contains(string(p), `"t":"ready"`) {
		t.Fatalf("hello answered with %v %q", h.OpCode, p)
	}
	if _, err := dial("127.0.0.1"); err != nil {
		t.Fatalf("an upgrade after one of the address's sockets said hello: %v", err)
	}
}
