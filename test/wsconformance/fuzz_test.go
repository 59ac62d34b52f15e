package wsconformance

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"

	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
)

var (
	fuzzOnce sync.Once
	fuzzURL  string
	fuzzErr  error
)

// fuzzEdge is one edge for the whole fuzzing process.
func fuzzEdge(t *testing.T) string {
	fuzzOnce.Do(func() {
		var g *gateway.Gateway
		g, fuzzErr = gateway.Start(context.Background(), gateway.Config{
			Listen: "127.0.0.1:0",
			Router: true,
			Edge:   edge.Config{Auth: edge.AuthConfig{Token: token}},
		}, nil)
		if fuzzErr == nil {
			fuzzURL = g.URL()
		}
	})
	if fuzzErr != nil {
		t.Fatal(fuzzErr)
	}
	return fuzzURL
}

// FuzzFrameReader writes arbitrary bytes, after a hello, to a real edge and
// checks what comes back: well-formed server frames (unmasked, no reserved
// bits, control frames final and at most 125 bytes), at most one close frame
// and nothing after it, a close code the RFC allows on the wire with a UTF-8
// reason, and the socket closed once the client stops writing. A panic in the
// edge ends the fuzzing process.
func FuzzFrameReader(f *testing.F) {
	seeds := [][]byte{
		encode(true, 0, ws.OpText, ping("seed")),
		encode(true, 0, ws.OpPing, []byte("p")),
		encode(true, 0, ws.OpPong, nil),
		encode(true, 0, ws.OpClose, closeBody(1000, "bye")),
		encode(true, 0, ws.OpClose, closeBody(1005, "")),
		encode(true, 0, ws.OpClose, closeBody(5000, "\xff")),
		encode(true, 0, ws.OpClose, []byte{3}),
		encode(true, 4, ws.OpText, ping("rsv")),
		encode(true, 0, 3, nil),
		encode(false, 0, ws.OpPing, nil),
		append(encode(false, 0, ws.OpText, ping("a")[:5]), encode(true, 0, ws.OpContinuation, ping("a")[5:])...),
		encode(true, 0, ws.OpContinuation, ping("orphan")),
		encode(true, 0, ws.OpText, []byte("{\"t\":\"text\",\"id\":\"1\",\"text\":\"\xff\"}")),
		encode(true, 0, ws.OpText, []byte(`{"t":"text","id":"f1","text":"hi"}`)),
		{0x81, 0x80 | 127, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4},
		{0x81, 0x80 | 127, 0, 0, 0, 0, 1, 0, 0, 1, 1, 2, 3, 4},
		{0x81, 0x05, 'h', 'e', 'l', 'l', 'o'},
		{},
	}
	for _, s := range seeds {
		f.Add(s)
	}
	var seq int64
	f.Fuzz(func(t *testing.T, in []byte) {
		url := fuzzEdge(t)
		nc, br, _, err := ws.Dialer{Timeout: 5 * time.Second}.Dial(context.Background(), url)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer nc.Close()
		seq++
		hello := encode(true, 0, ws.OpText, []byte(`{"t":"hello","token":"`+token+`","device":{"id":"fuzz-`+strconv.FormatInt(seq, 10)+`"}}`))
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := nc.Write(append(hello, in...)); err != nil {
			t.Fatalf("write: %v", err)
		}
		nc.(*net.TCPConn).CloseWrite()
		var r io.Reader = nc
		if br != nil {
			r = io.MultiReader(br, nc)
		}
		closed := false
		for {
			h, err := ws.ReadHeader(r)
			if err != nil {
				if err == io.EOF || isClosedErr(err) {
					return // the edge closed the socket
				}
				t.Fatalf("reading the edge's frames: %v", err)
			}
			if closed {
				t.Fatalf("a frame after the close frame: %+v", h)
			}
			if h.Masked || h.Rsv != 0 || h.OpCode.IsReserved() {
				t.Fatalf("bad frame from the edge: %+v", h)
			}
			if h.OpCode.IsControl() && (h.Length > 125 || !h.Fin) {
				t.Fatalf("bad control frame from the edge: %+v", h)
			}
			p := make([]byte, h.Length)
			if _, err := io.ReadFull(r, p); err != nil {
				t.Fatalf("reading a payload: %v", err)
			}
			if h.OpCode != ws.OpClose {
				continue
			}
			closed = true
			if len(p) == 1 {
				t.Fatalf("close frame with a 1-byte body")
			}
			if len(p) >= 2 {
				code := ws.StatusCode(binary.BigEndian.Uint16(p))
				if err := ws.CheckCloseFrameData(code, string(p[2:])); err != nil || code > 4999 {
					t.Fatalf("the edge sent close %d %q: %v", code, p[2:], err)
				}
				if !utf8.Valid(p[2:]) {
					t.Fatalf("close reason not UTF-8: %q", p[2:])
				}
			}
		}
	})
}

func isClosedErr(err error) bool {
	ne, ok := err.(*net.OpError)
	return ok && (ne.Err != nil && (ne.Err.Error() == "read: connection reset by peer" || ne.Err == net.ErrClosed))
}
