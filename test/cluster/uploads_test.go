//go:build unix

package cluster

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// The upload limits are per device, so they hold across edges while two
// connections of one device overlap. A takeover frees the old connection's
// buffers as soon as edge A hears of it, so these tests freeze edge A with
// SIGSTOP before the device reconnects to edge B: B's connection then meets
// buffers that A's connection still holds, for as long as the test needs,
// and after SIGCONT it sees them freed.

const mib = 1 << 20

// openPart sends part 0 of a two-part upload with size bytes and returns the
// error the edge answered with, or nil when it took the part.
func openPart(t *testing.T, conn *client.Conn, id string, size int) *client.ServerError {
	t.Helper()
	err := conn.Media(client.MediaUp{ID: id, Kind: "document", Mime: "application/octet-stream",
		Filename: id + ".bin", Data: fill(id, 0, size), Part: 0, Parts: 2})
	if err != nil {
		t.Fatal(err)
	}
	fs := pingBarrier(t, conn)
	es := errorsIn(fs)
	switch {
	case len(es) > 1:
		t.Fatalf("upload %s: several errors: %v", id, es)
	case len(es) == 1:
		return es[0]
	}
	if len(fs) > 0 {
		t.Fatalf("upload %s: unexpected frames:%s", id, describe(fs))
	}
	return nil
}

// finishUpload sends part 1 of id and checks that the demo sends the whole
// file back.
func finishUpload(t *testing.T, conn *client.Conn, id string, size0 int) {
	t.Helper()
	tail := fill(id, 1, 1000)
	err := conn.Media(client.MediaUp{ID: id, Kind: "document", Mime: "application/octet-stream",
		Filename: id + ".bin", Data: tail, Part: 1, Parts: 2})
	if err != nil {
		t.Fatal(err)
	}
	fs := readUntil(t, conn, "file "+id+" sent back", func(f client.Frame) bool {
		return f.T() == protocol.TypeMedia && f.Str("reply_to") == id && f.Bool("final")
	})
	if es := errorsIn(fs); len(es) > 0 {
		t.Fatalf("upload %s: %v", id, es)
	}
	var got []byte
	for _, f := range fs {
		if f.T() == protocol.TypeMedia && f.Str("reply_to") == id {
			b, err := base64.StdEncoding.DecodeString(f.Str("data"))
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, b...)
		}
	}
	if want := append(fill(id, 0, size0), tail...); !bytes.Equal(got, want) {
		t.Errorf("file %s came back with %d bytes, want the %d sent", id, len(got), len(want))
	}
}

// fill is the content of part of upload id.
func fill(id string, part, size int) []byte {
	seed := []byte(fmt.Sprintf("%s/%d;", id, part))
	return bytes.Repeat(seed, size/len(seed)+1)[:size]
}

// acceptedEventually retries opening an upload (each refusal drops it, so
// every try is a new one) until the edge takes it, for up to 5 s.
func acceptedEventually(t *testing.T, conn *client.Conn, id string, size int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		e := openPart(t, conn, id, size)
		if e == nil {
			return
		}
		if e.Code != protocol.CodeTooBig || time.Now().After(deadline) {
			t.Fatalf("upload %s of %d bytes after edge A freed its buffers: %v", id, size, e)
		}
		time.Sleep(20 * time.Millisecond) // a refused upload's retry pace
	}
}

// TestUploadByteBudgetAcrossEdges (f): the 8 MiB of open upload buffers
// are the device's, whichever edges hold them.
func TestUploadByteBudgetAcrossEdges(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	dev := newDevice("tel")
	a := c.connect(t, "A", dev)
	for _, id := range []string{"a-1", "a-2"} {
		if e := openPart(t, a, id, 3*mib); e != nil {
			t.Fatalf("upload %s on A: %v", id, e)
		}
	}

	edgeA := c.edge("A")
	edgeA.Signal(t, syscall.SIGSTOP) // A's connection keeps its 6 MiB
	b := c.connect(t, "B", dev)
	if e := openPart(t, b, "b-1", 3*mib); e == nil || e.Code != protocol.CodeTooBig || e.Fatal {
		t.Fatalf("3 MiB on B while A holds 6 MiB: %v, want a non-fatal too_big", e)
	}
	if e := openPart(t, b, "b-2", 1*mib); e != nil {
		t.Fatalf("1 MiB on B while A holds 6 MiB (7 MiB in all): %v, want it taken", e)
	}

	edgeA.Signal(t, syscall.SIGCONT) // A hears of the takeover and frees
	expectClose(t, a, 5*time.Second, 1000)
	acceptedEventually(t, b, "b-3", 3*mib)
	if e := openPart(t, b, "b-4", 5*mib); e == nil || e.Code != protocol.CodeTooBig {
		t.Fatalf("5 MiB on B holding 4 MiB: %v, want too_big", e)
	}
	finishUpload(t, b, "b-2", 1*mib)
	finishUpload(t, b, "b-3", 3*mib)
}

// TestUploadCountAcrossEdges (f): at most 8 unfinished uploads per device,
// whichever edges hold them.
func TestUploadCountAcrossEdges(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	dev := newDevice("tel")
	a := c.connect(t, "A", dev)
	for i := range protocol.MaxOpenUploads {
		if e := openPart(t, a, fmt.Sprintf("a-%d", i), 4096); e != nil {
			t.Fatalf("upload %d on A: %v", i, e)
		}
	}
	if e := openPart(t, a, "a-9", 4096); e == nil || e.Code != protocol.CodeTooBig || e.Fatal {
		t.Fatalf("a ninth upload on A: %v, want a non-fatal too_big", e)
	}

	edgeA := c.edge("A")
	edgeA.Signal(t, syscall.SIGSTOP) // A's connection keeps its 8 uploads
	b := c.connect(t, "B", dev)
	if e := openPart(t, b, "b-0", 4096); e == nil || e.Code != protocol.CodeTooBig || e.Fatal {
		t.Fatalf("an upload on B while A holds 8: %v, want a non-fatal too_big", e)
	}

	edgeA.Signal(t, syscall.SIGCONT)
	expectClose(t, a, 5*time.Second, 1000)
	acceptedEventually(t, b, "b-0", 4096)
	for i := 1; i < protocol.MaxOpenUploads; i++ {
		if e := openPart(t, b, fmt.Sprintf("b-%d", i), 4096); e != nil {
			t.Fatalf("upload %d on B after A freed its uploads: %v", i, e)
		}
	}
	if e := openPart(t, b, "b-9", 4096); e == nil || e.Code != protocol.CodeTooBig {
		t.Fatalf("a ninth upload on B: %v, want too_big", e)
	}
	finishUpload(t, b, "b-0", 4096)
}
