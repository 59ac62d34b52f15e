//go:build unix

package fault

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"sync"
	"time"
)

// The silent-network fault: a phone's network dies without a word while
// the gateway flushes its outbox. A blackhole is a loopback TCP proxy in
// front of one socket of one phone: it forwards the WebSocket handshake
// and the first frame the edge sends (ready), then forwards nothing more,
// either way, and never closes or resets either side. To the edge the
// socket is alive and every write succeeds (into the kernel's buffers, as
// on a real network until its window fills); to the phone the edge is
// silent, so it gives the socket up for want of a pong and connects to
// another edge, as the app does when a network dies.
type blackhole struct {
	ln     net.Listener
	target string // the edge's host:port

	mu    sync.Mutex
	phone net.Conn // the phone's side
	edge  net.Conn // the edge's side
	held  []byte   // what the edge wrote after ready, read but not forwarded
	ready bool     // ready went through: the hole is closed
	done  chan struct{}
}

// newBlackhole listens on a loopback port for one connection to forward
// to target (host:port).
func newBlackhole(target string) (*blackhole, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &blackhole{ln: ln, target: target, done: make(chan struct{})}
	go b.serve()
	return b, nil
}

// addr is where the phone connects instead of the edge.
func (b *blackhole) addr() string { return b.ln.Addr().String() }

func (b *blackhole) serve() {
	defer close(b.done)
	phone, err := b.ln.Accept()
	b.ln.Close()
	if err != nil {
		return
	}
	edge, err := net.Dial("tcp", b.target)
	if err != nil {
		phone.Close()
		return
	}
	b.mu.Lock()
	b.phone, b.edge = phone, edge
	b.mu.Unlock()
	go b.toEdge()
	b.toPhone()
}

// silent reports whether ready went through and nothing passes any more.
func (b *blackhole) silent() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ready
}

// toEdge forwards the phone's bytes until the hole closes; after that it
// reads and drops them (the phone's pings and acks vanish in the network).
func (b *blackhole) toEdge() {
	buf := make([]byte, 32<<10)
	for {
		n, err := b.phone.Read(buf)
		if n > 0 && !b.silent() {
			if _, werr := b.edge.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // the phone gave its socket up; the edge is not told
		}
	}
}

// toPhone forwards the handshake's answer as soon as it is whole (the
// phone sends hello only after it), then the first frame, then stops
// reading the edge's side: the edge's writes pile up unread.
func (b *blackhole) toPhone() {
	var in []byte
	answered := false
	buf := make([]byte, 32<<10)
	for {
		n, err := b.edge.Read(buf)
		in = append(in, buf[:n]...)
		if !answered {
			if h := bytes.Index(in, []byte("\r\n\r\n")); h >= 0 {
				if _, werr := b.phone.Write(in[:h+4]); werr != nil {
					return
				}
				in, answered = in[h+4:], true
			}
		}
		if end := frameLen(in); answered && end > 0 {
			_, _ = b.phone.Write(in[:end]) // the phone may be gone already: then it never sees ready
			b.mu.Lock()
			b.held = append([]byte(nil), in[end:]...)
			b.ready = true
			b.mu.Unlock()
			return
		}
		if err != nil {
			return
		}
	}
}

// frameLen is the length of the WebSocket frame that starts p (header and
// payload), or 0 when p holds less than the whole frame.
func frameLen(p []byte) int {
	if len(p) < 2 {
		return 0
	}
	hdr, l := 2, uint64(p[1]&0x7f)
	switch l {
	case 126:
		if len(p) < 4 {
			return 0
		}
		hdr, l = 4, uint64(binary.BigEndian.Uint16(p[2:4]))
	case 127:
		if len(p) < 10 {
			return 0
		}
		hdr, l = 10, binary.BigEndian.Uint64(p[2:10])
	}
	if p[1]&0x80 != 0 {
		hdr += 4
	}
	if uint64(len(p)) < uint64(hdr)+l {
		return 0
	}
	return hdr + int(l)
}

// unread closes the blackhole and returns how many message and media
// frames the edge wrote into it after ready: written to the socket, never
// read by the phone. It reads what the edge's side still holds until the
// edge closed it or for at most a second.
func (b *blackhole) unread() int {
	b.ln.Close()
	b.mu.Lock()
	phone, edge, held := b.phone, b.edge, b.held
	b.mu.Unlock()
	if phone != nil {
		phone.Close()
	}
	if edge == nil {
		return 0
	}
	_ = edge.SetReadDeadline(time.Now().Add(time.Second))
	rest, _ := io.ReadAll(edge) // until EOF, a reset or the deadline: what was read counts
	edge.Close()
	<-b.done
	return countMessages(append(held, rest...))
}

// countMessages counts the message and media frames among the whole
// WebSocket frames of p.
func countMessages(p []byte) int {
	count := 0
	for {
		n := frameLen(p)
		if n == 0 {
			return count
		}
		f := p[:n]
		p = p[n:]
		if op := f[0] & 0x0f; op != 1 && op != 2 {
			continue
		}
		hdr := n - payloadLen(f)
		var m struct {
			T string `json:"t"`
		}
		if json.Unmarshal(f[hdr:], &m) == nil && (m.T == "message" || m.T == "media") {
			count++
		}
	}
}

// payloadLen is the payload length of the whole frame f.
func payloadLen(f []byte) int {
	switch l := int(f[1] & 0x7f); l {
	case 126:
		return int(binary.BigEndian.Uint16(f[2:4]))
	case 127:
		return int(binary.BigEndian.Uint64(f[2:10]))
	default:
		return l
	}
}
