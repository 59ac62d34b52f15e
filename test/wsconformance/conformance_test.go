package wsconformance

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
)

const token = "conformance-token"

// startEdge runs a single-node gateway on loopback and returns its URL.
func startEdge(t *testing.T) string {
	t.Helper()
	g, err := gateway.Start(context.Background(), gateway.Config{
		Listen: "127.0.0.1:0",
		Router: true,
		Edge:   edge.Config{Auth: edge.AuthConfig{Token: token}},
	}, nil)
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return g.URL()
}

var deviceSeq atomic.Int64

// peer is a raw WebSocket client: it writes any bytes and reads frames.
type peer struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

// open dials url and says hello (so that messages are handled, not refused
// as a first frame that is not hello).
func open(t *testing.T, url string) *peer {
	t.Helper()
	nc, br, _, err := ws.Dialer{Timeout: 5 * time.Second}.Dial(context.Background(), url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	if br == nil {
		br = bufio.NewReader(nc)
	}
	p := &peer{t: t, nc: nc, br: br}
	dev := "conf-" + strconv.FormatInt(deviceSeq.Add(1), 10)
	p.frame(true, 0, ws.OpText, []byte(`{"t":"hello","token":"`+token+`","device":{"id":"`+dev+`"}}`))
	if h, b := p.read(); h.OpCode != ws.OpText || !strings.Contains(string(b), `"t":"ready"`) {
		t.Fatalf("hello answered with %v %q", h.OpCode, b)
	}
	return p
}

// raw writes bytes as they are.
func (p *peer) raw(b []byte) {
	p.t.Helper()
	p.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := p.nc.Write(b); err != nil {
		p.t.Fatalf("write: %v", err)
	}
}

// encode builds a masked client frame with any bits set.
func encode(fin bool, rsv byte, op ws.OpCode, payload []byte) []byte {
	b0 := byte(op) | rsv<<4
	if fin {
		b0 |= 0x80
	}
	b := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n <= 0xffff:
		b = append(b, 0x80|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	mask := [4]byte{0x37, 0xfa, 0x21, 0x3d}
	b = append(b, mask[:]...)
	start := len(b)
	b = append(b, payload...)
	ws.Cipher(b[start:], mask, 0)
	return b
}

func (p *peer) frame(fin bool, rsv byte, op ws.OpCode, payload []byte) {
	p.t.Helper()
	p.raw(encode(fin, rsv, op, payload))
}

func (p *peer) tryRead() (ws.Header, []byte, error) {
	p.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	h, err := ws.ReadHeader(p.br)
	if err != nil {
		return h, nil, err
	}
	if h.Masked || h.Rsv != 0 {
		return h, nil, fmt.Errorf("the server sent a masked frame or reserved bits: %+v", h)
	}
	b := make([]byte, h.Length)
	if _, err := io.ReadFull(p.br, b); err != nil {
		return h, nil, err
	}
	return h, b, nil
}

func (p *peer) read() (ws.Header, []byte) {
	p.t.Helper()
	h, b, err := p.tryRead()
	if err != nil {
		p.t.Fatalf("read: %v", err)
	}
	return h, b
}

func ping(ts string) []byte { return []byte(`{"t":"ping","ts":"` + ts + `"}`) }

// expectPong reads the protocol pong for ts.
func (p *peer) expectPong(ts string) {
	p.t.Helper()
	h, b := p.read()
	if h.OpCode != ws.OpText || string(b) != `{"t":"pong","ts":"`+ts+`"}` {
		p.t.Fatalf("want pong %q, got %v %.200q", ts, h.OpCode, b)
	}
}

// expectControlPong reads a WebSocket pong carrying payload.
func (p *peer) expectControlPong(payload []byte) {
	p.t.Helper()
	h, b := p.read()
	if h.OpCode != ws.OpPong || !h.Fin || string(b) != string(payload) {
		p.t.Fatalf("want pong %q, got %v fin=%v %q", payload, h.OpCode, h.Fin, b)
	}
}

// expectClose reads the server's close frame (after any other frames it
// sends first), checks its code (-1: an empty body) and that the server then
// drops TCP.
func (p *peer) expectClose(code int) {
	p.t.Helper()
	for {
		h, b, err := p.tryRead()
		if err != nil {
			p.t.Fatalf("want close %d, the read ended: %v", code, err)
		}
		if h.OpCode != ws.OpClose {
			continue
		}
		got := -1
		if len(b) >= 2 {
			got = int(binary.BigEndian.Uint16(b))
		}
		if got != code {
			p.t.Fatalf("close code %d (%q), want %d", got, b, code)
		}
		if len(b) > 2 && !isUTF8(b[2:]) {
			p.t.Fatalf("close reason is not UTF-8: %q", b[2:])
		}
		break
	}
	p.expectEOF()
}

// expectEOF checks that the server closed TCP (after the close handshake).
func (p *peer) expectEOF() {
	p.t.Helper()
	p.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, p.br)
	if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		p.t.Fatalf("the server did not close TCP: %v", err)
	}
}

func isUTF8(b []byte) bool { return strings.ToValidUTF8(string(b), "\uFFFD") == string(b) }

// pad is a ts of n bytes.
func pad(n int) string { return strings.Repeat("x", n) }

// sizedPing is a ping of exactly n bytes and the ts its pong echoes: the ts
// stays within the protocol's bound on what a pong echoes (1 KiB), and a
// member the protocol ignores carries the rest.
func sizedPing(n int) (msg []byte, ts string) {
	if n-len(ping("")) <= 1000 {
		ts = pad(n - len(ping("")))
		return ping(ts), ts
	}
	const head, tail = `{"t":"ping","ts":"x","pad":"`, `"}`
	return []byte(head + pad(n-len(head)-len(tail)) + tail), "x"
}

// --- Group 1: framing --------------------------------------------------

func TestFraming(t *testing.T) {
	url := startEdge(t)
	overhead := len(ping(""))
	// Payload lengths across the 7-bit, 16-bit and 64-bit encodings.
	for _, n := range []int{overhead, 125, 126, 127, 128, 65535, 65536, 1 << 20} {
		t.Run("text "+strconv.Itoa(n), func(t *testing.T) {
			p := open(t, url)
			msg, ts := sizedPing(n)
			p.frame(true, 0, ws.OpText, msg)
			p.expectPong(ts)
		})
	}
	t.Run("binary", func(t *testing.T) {
		// A binary message is read like a text one (the protocol has JSON
		// messages only); the framing is what is checked here.
		p := open(t, url)
		p.frame(true, 0, ws.OpBinary, ping("bin"))
		p.expectPong("bin")
	})
	t.Run("bytes one at a time", func(t *testing.T) {
		p := open(t, url)
		for _, b := range encode(true, 0, ws.OpText, ping("slow")) {
			p.raw([]byte{b})
		}
		p.expectPong("slow")
	})
	t.Run("several frames in one write", func(t *testing.T) {
		p := open(t, url)
		var b []byte
		for i := range 10 {
			b = append(b, encode(true, 0, ws.OpText, ping(strconv.Itoa(i)))...)
		}
		p.raw(b)
		for i := range 10 {
			p.expectPong(strconv.Itoa(i))
		}
	})
	t.Run("unmasked frame", func(t *testing.T) {
		p := open(t, url)
		b := ping("unmasked")
		p.raw(append([]byte{0x81, byte(len(b))}, b...))
		p.expectClose(1002)
	})
	t.Run("64-bit length with the top bit set", func(t *testing.T) {
		p := open(t, url)
		p.raw([]byte{0x81, 0x80 | 127, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4})
		p.expectClose(1002)
	})
}

// --- Group 2: ping/pong ------------------------------------------------

func TestPingPong(t *testing.T) {
	url := startEdge(t)
	for _, payload := range [][]byte{nil, []byte("hello"), {0x00, 0xff, 0xfe, 0xfd, 0xfc}, []byte(pad(125))} {
		t.Run(fmt.Sprintf("ping %d bytes", len(payload)), func(t *testing.T) {
			p := open(t, url)
			p.frame(true, 0, ws.OpPing, payload)
			p.expectControlPong(payload)
		})
	}
	t.Run("ping 126 bytes", func(t *testing.T) {
		p := open(t, url)
		p.frame(true, 0, ws.OpPing, []byte(pad(126)))
		p.expectClose(1002)
	})
	t.Run("unsolicited pong is ignored", func(t *testing.T) {
		p := open(t, url)
		p.frame(true, 0, ws.OpPong, nil)
		p.frame(true, 0, ws.OpPong, []byte("unsolicited"))
		p.frame(true, 0, ws.OpText, ping("after"))
		p.expectPong("after")
	})
	t.Run("ten pings, ten pongs in order", func(t *testing.T) {
		p := open(t, url)
		var b []byte
		for i := range 10 {
			b = append(b, encode(true, 0, ws.OpPing, []byte("p"+strconv.Itoa(i)))...)
		}
		p.raw(b)
		for i := range 10 {
			p.expectControlPong([]byte("p" + strconv.Itoa(i)))
		}
	})
}

// --- Group 3: reserved bits --------------------------------------------

func TestReservedBits(t *testing.T) {
	url := startEdge(t)
	for rsv := byte(1); rsv <= 7; rsv++ {
		for _, op := range []ws.OpCode{ws.OpText, ws.OpBinary, ws.OpPing, ws.OpClose} {
			t.Run(fmt.Sprintf("rsv %d op %d", rsv, op), func(t *testing.T) {
				p := open(t, url)
				// A good message first, then the bad frame, then a ping
				// that must not be answered: the pong for the first comes,
				// then close 1002.
				b := encode(true, 0, ws.OpText, ping("first"))
				b = append(b, encode(true, rsv, op, ping("bad"))[:]...)
				b = append(b, encode(true, 0, ws.OpPing, nil)...)
				p.raw(b)
				p.expectPong("first")
				p.expectClose(1002)
			})
		}
	}
}

// --- Group 4: opcodes --------------------------------------------------

func TestReservedOpcodes(t *testing.T) {
	url := startEdge(t)
	for _, op := range []ws.OpCode{3, 4, 5, 6, 7, 0xb, 0xc, 0xd, 0xe, 0xf} {
		for _, payload := range [][]byte{nil, []byte("reserved")} {
			t.Run(fmt.Sprintf("op %d, %d bytes", op, len(payload)), func(t *testing.T) {
				p := open(t, url)
				b := encode(true, 0, ws.OpText, ping("first"))
				b = append(b, encode(true, 0, op, payload)...)
				b = append(b, encode(true, 0, ws.OpPing, nil)...)
				p.raw(b)
				p.expectPong("first")
				p.expectClose(1002)
			})
		}
	}
}

// --- Group 5: fragmentation --------------------------------------------

func TestFragmentation(t *testing.T) {
	url := startEdge(t)
	t.Run("fragmented ping", func(t *testing.T) {
		p := open(t, url)
		p.frame(false, 0, ws.OpPing, []byte("frag"))
		p.frame(true, 0, ws.OpContinuation, []byte("ment"))
		p.expectClose(1002)
	})
	t.Run("fragmented pong", func(t *testing.T) {
		p := open(t, url)
		p.frame(false, 0, ws.OpPong, []byte("frag"))
		p.frame(true, 0, ws.OpContinuation, []byte("ment"))
		p.expectClose(1002)
	})
	t.Run("text in two fragments", func(t *testing.T) {
		p := open(t, url)
		m := ping("two")
		p.frame(false, 0, ws.OpText, m[:7])
		p.frame(true, 0, ws.OpContinuation, m[7:])
		p.expectPong("two")
	})
	t.Run("one byte per fragment", func(t *testing.T) {
		p := open(t, url)
		m := ping("bytes")
		var b []byte
		for i := range m {
			op := ws.OpContinuation
			if i == 0 {
				op = ws.OpText
			}
			b = append(b, encode(i == len(m)-1, 0, op, m[i:i+1])...)
		}
		p.raw(b)
		p.expectPong("bytes")
	})
	t.Run("empty fragments", func(t *testing.T) {
		p := open(t, url)
		m := ping("empty")
		p.frame(false, 0, ws.OpText, nil)
		p.frame(false, 0, ws.OpContinuation, m)
		p.frame(false, 0, ws.OpContinuation, nil)
		p.frame(true, 0, ws.OpContinuation, nil)
		p.expectPong("empty")
	})
	t.Run("pings between fragments", func(t *testing.T) {
		p := open(t, url)
		m := ping("between")
		p.frame(false, 0, ws.OpText, m[:5])
		p.frame(true, 0, ws.OpPing, []byte("a"))
		p.frame(false, 0, ws.OpContinuation, m[5:10])
		p.frame(true, 0, ws.OpPing, []byte("b"))
		p.frame(true, 0, ws.OpContinuation, m[10:])
		p.expectControlPong([]byte("a"))
		p.expectControlPong([]byte("b"))
		p.expectPong("between")
	})
	t.Run("continuation without a start", func(t *testing.T) {
		p := open(t, url)
		p.frame(true, 0, ws.OpContinuation, ping("orphan"))
		p.expectClose(1002)
	})
	t.Run("non-final continuation without a start", func(t *testing.T) {
		p := open(t, url)
		p.frame(false, 0, ws.OpContinuation, ping("orphan"))
		p.frame(true, 0, ws.OpContinuation, nil)
		p.expectClose(1002)
	})
	t.Run("text inside a fragmented text", func(t *testing.T) {
		p := open(t, url)
		p.frame(false, 0, ws.OpText, []byte(`{"t":`))
		p.frame(true, 0, ws.OpText, ping("inner"))
		p.expectClose(1002)
	})
	t.Run("binary inside a fragmented text", func(t *testing.T) {
		p := open(t, url)
		p.frame(false, 0, ws.OpText, []byte(`{"t":`))
		p.frame(false, 0, ws.OpBinary, []byte(`"ping"`))
		p.expectClose(1002)
	})
}

// --- Group 6: UTF-8 ----------------------------------------------------

func TestUTF8(t *testing.T) {
	url := startEdge(t)
	t.Run("valid, split inside code points", func(t *testing.T) {
		p := open(t, url)
		ts := "κόσμε-€-𝄞-日本"
		m := ping(ts)
		var b []byte
		for i := range m {
			op := ws.OpContinuation
			if i == 0 {
				op = ws.OpText
			}
			b = append(b, encode(i == len(m)-1, 0, op, m[i:i+1])...)
		}
		p.raw(b)
		p.expectPong(ts)
	})
	// Protocol v1 ("Frames"): a message that is not UTF-8 gets a non-fatal
	// bad_frame error, and the connection goes on.
	for _, bad := range []string{"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "caf\xe9", "\xce\xba\xe1\xbd"} {
		t.Run(fmt.Sprintf("invalid %q", bad), func(t *testing.T) {
			p := open(t, url)
			m := ping(bad)
			p.frame(false, 0, ws.OpText, m[:len(m)-3])
			p.frame(true, 0, ws.OpContinuation, m[len(m)-3:])
			h, b := p.read()
			if h.OpCode != ws.OpText || !strings.Contains(string(b), `"code":"bad_frame"`) || strings.Contains(string(b), `"fatal":true`) {
				t.Fatalf("invalid UTF-8 answered with %v %q, want a non-fatal bad_frame", h.OpCode, b)
			}
			p.frame(true, 0, ws.OpText, ping("after"))
			p.expectPong("after")
		})
	}
}

// --- Group 7: close ----------------------------------------------------

func closeBody(code int, reason string) []byte {
	return append(binary.BigEndian.AppendUint16(nil, uint16(code)), reason...)
}

func TestClose(t *testing.T) {
	url := startEdge(t)
	t.Run("empty close is answered with an empty close", func(t *testing.T) {
		p := open(t, url)
		p.frame(true, 0, ws.OpClose, nil)
		p.expectClose(-1)
	})
	t.Run("nothing is handled after the close", func(t *testing.T) {
		p := open(t, url)
		b := encode(true, 0, ws.OpClose, closeBody(1000, ""))
		b = append(b, encode(true, 0, ws.OpText, ping("late"))...)
		b = append(b, encode(true, 0, ws.OpPing, []byte("late"))...)
		p.raw(b)
		h, body := p.read()
		if h.OpCode != ws.OpClose || binary.BigEndian.Uint16(body) != 1000 {
			t.Fatalf("want close 1000 first, got %v %q", h.OpCode, body)
		}
		p.expectEOF()
	})
	t.Run("close with a 1-byte body", func(t *testing.T) {
		p := open(t, url)
		p.frame(true, 0, ws.OpClose, []byte{0x03})
		p.expectClose(1002)
	})
	t.Run("close with a 123-byte reason", func(t *testing.T) {
		p := open(t, url)
		p.frame(true, 0, ws.OpClose, closeBody(1000, pad(123)))
		p.expectClose(1000)
	})
	t.Run("close with 124 bytes of reason (126 in all)", func(t *testing.T) {
		p := open(t, url)
		p.frame(true, 0, ws.OpClose, closeBody(1000, pad(124)))
		p.expectClose(1002)
	})
	t.Run("close reason not UTF-8", func(t *testing.T) {
		p := open(t, url)
		p.frame(true, 0, ws.OpClose, closeBody(1000, "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80"))
		p.expectClose(1007)
	})
	for _, code := range []int{1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999} {
		t.Run("valid code "+strconv.Itoa(code), func(t *testing.T) {
			p := open(t, url)
			p.frame(true, 0, ws.OpClose, closeBody(code, "bye"))
			p.expectClose(code)
		})
	}
	for _, code := range []int{0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535} {
		t.Run("invalid code "+strconv.Itoa(code), func(t *testing.T) {
			p := open(t, url)
			p.frame(true, 0, ws.OpClose, closeBody(code, ""))
			p.expectClose(1002)
		})
	}
	t.Run("the server's close is acknowledged", func(t *testing.T) {
		// A framing error makes the server close first; the client's
		// answering close ends the handshake.
		p := open(t, url)
		p.frame(true, 4, ws.OpText, ping("x"))
		h, b := p.read()
		if h.OpCode != ws.OpClose || binary.BigEndian.Uint16(b) != 1002 {
			t.Fatalf("want close 1002, got %v %q", h.OpCode, b)
		}
		p.frame(true, 0, ws.OpClose, closeBody(1002, ""))
		p.expectEOF()
	})
}
