package gateway_test

// A phone on a slow link must get its file, however long the whole write
// takes, while one that stops reading is cut off after WriteTimeout without
// progress. The phone here is a raw socket with a small receive buffer whose
// reads are throttled, so the edge's writes really wait on it.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"golang.org/x/sys/unix"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/gateway"
)

// srConn is a client socket whose reads return at most chunk bytes, each
// after pause: about chunk/pause bytes a second.
type srConn struct {
	net.Conn
	chunk int
	pause time.Duration
}

func (c *srConn) Read(p []byte) (int, error) {
	time.Sleep(c.pause) // the slow reader under test
	return c.Conn.Read(p[:min(len(p), c.chunk)])
}

// srDrain reads src at its own pace in a goroutine of its own and hands
// what it read to the returned reader, however slowly that is read.
func srDrain(src io.Reader) io.Reader {
	chunks := make(chan []byte, 4096) // 11 MiB in reads of at most 64 KiB: never full
	go func() {
		defer close(chunks)
		for {
			b := make([]byte, 64<<10)
			n, err := src.Read(b)
			if n > 0 {
				chunks <- b[:n]
			}
			if err != nil {
				return
			}
		}
	}()
	return &srChunks{chunks: chunks}
}

type srChunks struct {
	chunks <-chan []byte
	rest   []byte
}

func (r *srChunks) Read(p []byte) (int, error) {
	if len(r.rest) == 0 {
		b, ok := <-r.chunks
		if !ok {
			return 0, io.EOF
		}
		r.rest = b
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

// srDial opens a WebSocket to n with a 16 KiB receive buffer, says hello
// as device and waits for ready.
func srDial(t *testing.T, n *node, device string) (net.Conn, *wsutil.Reader) {
	t.Helper()
	d := ws.Dialer{NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		nd := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var err error
			rc.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10) })
			return err
		}}
		return nd.DialContext(ctx, network, addr)
	}}
	nc, _, _, err := d.Dial(testCtx(t), n.URL())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	hello, _ := json.Marshal(map[string]any{"t": "hello", "token": testToken,
		"device": map[string]any{"id": device, "name": "Slow", "platform": "android", "app_version": "1.0.0"}})
	if err := wsutil.WriteClientText(nc, hello); err != nil {
		t.Fatalf("hello: %v", err)
	}
	r := wsutil.NewClientSideReader(nc)
	if f := srNext(t, r); f["t"] != "ready" {
		t.Fatalf("after hello got %v, want ready", f["t"])
	}
	return nc, r
}

// srNext reads the next text frame as JSON, skipping control frames.
func srNext(t *testing.T, r *wsutil.Reader) map[string]any {
	t.Helper()
	for {
		h, err := r.NextFrame()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if h.OpCode.IsControl() {
			if _, err := io.Copy(io.Discard, r); err != nil {
				t.Fatalf("read control frame: %v", err)
			}
			continue
		}
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatalf("read frame: %v", err)
		}
		var f map[string]any
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatalf("frame is not JSON: %v", err)
		}
		return f
	}
}

// TestSlowReaderGetsWholeFile: the echo of an 8 MiB file is about 11 MiB
// of frames; read at 1.3 MiB/s at most it takes over twice WriteTimeout,
// and still arrives whole.
func TestSlowReaderGetsWholeFile(t *testing.T) {
	t.Parallel() // waits on a slow or stalled reader, not on the CPU
	// 3 s: a phone goroutine starved for a second (-race, packages in
	// parallel on 2 cores) is no stalled reader. The reader below is slowed
	// to match, so the file still takes more than two WriteTimeouts.
	const writeTimeout = 3 * time.Second
	n := startNode(t, func(c *gateway.Config) { c.Edge.WriteTimeout = writeTimeout })
	nc, r := srDial(t, n, "tel-slow")
	data := mdBytes(mdMax, 7)
	if err := wsutil.WriteClientText(nc, mdRaw(map[string]any{"t": "media", "id": "slow-1", "kind": "document",
		"mime": "application/octet-stream", "filename": "big.bin"}, data)); err != nil {
		t.Fatalf("upload: %v", err)
	}
	// From here on the phone reads 64 KiB per 48 ms at most: the 11 MiB of
	// the echo take at least 8.6 s.
	// The socket is drained at that pace by a goroutine of its own, so the
	// time the test takes to decode a 4 MiB frame (long under -race on a
	// busy machine) is not a pause in reading: a pause of WriteTimeout is
	// what a stalled reader is, and the edge would rightly cut it off.
	r.Source = srDrain(&srConn{Conn: nc, chunk: 64 << 10, pause: 48 * time.Millisecond})
	start := time.Now()
	got := 0
	for got < len(data) {
		f := srNext(t, r)
		if f["t"] != "media" {
			continue
		}
		s, _ := f["data"].(string)
		got += len(s) / 4 * 3
		if f["final"] == true {
			break
		}
	}
	took := time.Since(start)
	if got < len(data)-2 {
		t.Fatalf("got %d bytes of the file, want %d", got, len(data))
	}
	if took < 2*writeTimeout {
		t.Fatalf("the file arrived in %v: the reader was not slow enough to test anything", took)
	}
	t.Logf("%d bytes in %v with WriteTimeout %v", got, took, writeTimeout)
}

// TestStalledReaderIsCutOff: a phone that stops reading is disconnected
// once the edge's write has made no progress for WriteTimeout.
func TestStalledReaderIsCutOff(t *testing.T) {
	t.Parallel() // waits on a slow or stalled reader, not on the CPU
	const writeTimeout = time.Second
	n := startNode(t, func(c *gateway.Config) { c.Edge.WriteTimeout = writeTimeout })
	nc, _ := srDial(t, n, "tel-stalled")
	if err := wsutil.WriteClientText(nc, mdRaw(map[string]any{"t": "media", "id": "stall-1", "kind": "document",
		"mime": "application/octet-stream", "filename": "big.bin"}, mdBytes(mdMax, 8))); err != nil {
		t.Fatalf("upload: %v", err)
	}
	// The phone reads nothing more: the edge must let go of it.
	testsvc.WaitFor(t, 10*time.Second, fmt.Sprintf("the edge to let go of a phone that stopped reading (WriteTimeout %v)", writeTimeout),
		func() bool { return n.Edge.Conns() == 0 })
}

// TestStalledReaderIsCutOnTime: a phone with the kernel's default buffers
// stops reading. The edge's own send buffer keeps growing and taking bytes
// for a while, which used to count as progress (the cut came three
// WriteTimeouts after the last byte reached the phone); progress is what
// the phone acknowledged, so the cut comes between WriteTimeout and
// 1.25 × WriteTimeout after the last byte arrived in the phone's receive
// queue (read without reading, by SIOCINQ).
func TestStalledReaderIsCutOnTime(t *testing.T) {
	t.Parallel() // waits on a slow or stalled reader, not on the CPU
	const writeTimeout = 2 * time.Second
	n := startNode(t, func(c *gateway.Config) { c.Edge.WriteTimeout = writeTimeout })
	nc, _, _, err := ws.Dialer{}.Dial(testCtx(t), n.URL())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	hello, _ := json.Marshal(map[string]any{"t": "hello", "token": testToken,
		"device": map[string]any{"id": "tel-stall-time", "name": "Stalled", "platform": "android", "app_version": "1.0.0"}})
	if err := wsutil.WriteClientText(nc, hello); err != nil {
		t.Fatalf("hello: %v", err)
	}
	// The echo of an 8 MiB file is far more than both kernels' buffers.
	if err := wsutil.WriteClientText(nc, mdRaw(map[string]any{"t": "media", "id": "stall-time-1", "kind": "document",
		"mime": "application/octet-stream", "filename": "big.bin"}, mdBytes(mdMax, 9))); err != nil {
		t.Fatalf("upload: %v", err)
	}
	raw, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		var v int
		raw.Control(func(fd uintptr) { v, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		if err != nil {
			t.Fatalf("SIOCINQ: %v", err)
		}
		return v
	}
	last, lastAt := -1, time.Now()
	for n.Edge.Conns() > 0 {
		if v := queued(); v != last {
			last, lastAt = v, time.Now()
		}
		if time.Since(lastAt) > 10*writeTimeout {
			t.Fatalf("a phone that stopped reading is still connected %v after its last byte arrived", time.Since(lastAt))
		}
		time.Sleep(5 * time.Millisecond) // poll interval: the loop waits for its condition
	}
	cut := time.Since(lastAt)
	t.Logf("cut %v after the last byte arrived (%d bytes unread)", cut, last)
	// The lower bound allows for the poll's own lateness in seeing the last
	// byte; the upper one for scheduling on a loaded machine.
	if lo, hi := writeTimeout-100*time.Millisecond, writeTimeout*5/4+750*time.Millisecond; cut < lo || cut > hi {
		t.Fatalf("cut %v after the last byte arrived; want between %v and %v (WriteTimeout %v)", cut, lo, hi, writeTimeout)
	}
}
