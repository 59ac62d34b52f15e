package gateway_test

// The WebSocket layer against unauthenticated and silent peers: the bound on
// a message before hello, and the keepalive that drops sockets whose phone
// vanished. Framing and close handling are in test/wsconformance.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
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

// TestKeepalive: with a short ping interval, a socket that never answers the
// edge's pings is closed, and one that answers them stays open and works.
func TestKeepalive(t *testing.T) {
	const interval = 100 * time.Millisecond
	n := hsNode(t, func(cfg *gateway.Config) { cfg.Edge.PingInterval = interval })

	hello := func(r *rbRaw, device string) {
		r.write(ws.OpText, true, []byte(`{"t":"hello","token":"`+testToken+`","device":{"id":"`+device+`"}}`))
		if h, p := r.read(); h.OpCode != ws.OpText || !strings.Contains(string(p), `"t":"ready"`) {
			t.Fatalf("hello answered with %v %q", h.OpCode, p)
		}
	}
	silent := rbDialRaw(t, n)
	hello(silent, "tel-silent")
	alive := rbDialRaw(t, n)
	hello(alive, "tel-alive")

	// The alive client answers every ping in the background.
	pings := make(chan struct{}, 1000)
	aliveErr := make(chan error, 1)
	go func() {
		for {
			alive.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
			h, err := ws.ReadHeader(alive.br)
			if err != nil {
				aliveErr <- err
				return
			}
			p := make([]byte, h.Length)
			if _, err := io.ReadFull(alive.br, p); err != nil {
				aliveErr <- err
				return
			}
			switch h.OpCode {
			case ws.OpPing:
				if err := ws.WriteFrame(alive.nc, ws.MaskFrame(ws.NewPongFrame(p))); err != nil {
					aliveErr <- err
					return
				}
				pings <- struct{}{}
			case ws.OpText:
				if string(p) == `{"t":"pong","ts":"still"}` {
					aliveErr <- nil
					return
				}
			default:
				aliveErr <- fmt.Errorf("unexpected frame %v", h.OpCode)
				return
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
	// The answering socket outlives it: it is pinged past the point where
	// the silent one was dropped (1+PingMisses intervals), and stays open.
	deadline := time.After(10 * time.Second)
	for got := 0; got < 5; {
		select {
		case <-pings:
			got++
		case err := <-aliveErr:
			t.Fatalf("the socket that answers pings ended after %d pings: %v", got, err)
		case <-deadline:
			t.Fatalf("the socket that answers pings got %d pings in 10 s", got)
		}
	}
	alive.write(ws.OpText, true, []byte(`{"t":"ping","ts":"still"}`))
	if err := <-aliveErr; err != nil {
		t.Fatalf("the socket that answers pings: %v", err)
	}
	hsWaitConns(t, n, 1)
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && strings.Contains(oe.Err.Error(), "reset")
}
