package gateway_test

// What a client sends is kept no bigger than the protocol allows: ids are
// cut to 128 characters where they are decoded, and what a connection
// keeps of them counts against its bounds.

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/gateway"
)

// TestLongAckIDsKeepOnlyTheirBound: two phones each ack 64 messages
// nobody waits for, with ids of 256 KiB. The edge remembers early acks,
// 64 per socket: kept whole they held 32 MiB (1.9 GiB with 15 MiB ids);
// cut to 128 characters and bounded to 8 KiB per socket, the test allows
// 4 MiB. A third phone round-trips meanwhile.
func TestLongAckIDsKeepOnlyTheirBound(t *testing.T) {
	const acks, size = 64, 256 << 10
	n := startNode(t, nil)
	a, _ := n.connect(t, "tel-ack-long-a")
	b, _ := n.connect(t, "tel-ack-long-b")
	phone, _ := n.connect(t, "tel-ack-long-phone")
	mtAlive(t, a)
	mtAlive(t, b)
	for i := range acks {
		for _, c := range []struct {
			name string
			send func([]byte) error
		}{{"a", a.SendRaw}, {"b", b.SendRaw}} {
			id := fmt.Sprintf("ack-%s-%d-", c.name, i)
			if err := c.send([]byte(`{"t":"ack","id":"` + id + strings.Repeat("x", size-len(id)) + `"}`)); err != nil {
				t.Fatalf("ack %d: %v", i, err)
			}
		}
		if i == acks/2 {
			mtMarker(t, n, phone, "tel-ack-long-phone")
		}
	}
	mtAlive(t, a) // every ack before the pong has been handled
	mtAlive(t, b)
	// What the two sockets hold is what closing them frees.
	open := testsvc.LiveHeap(t)
	a.CloseNow()
	b.CloseNow()
	waitFor(t, "the two sockets closed", func() bool { return n.Edge.Conns() == 1 })
	held := open - testsvc.LiveHeap(t)
	t.Logf("2 × %d acks of %d KiB ids: closing the sockets freed %d KiB", acks, size>>10, held>>10)
	if held > 4<<20 {
		t.Fatalf("2 × %d early acks with %d KiB ids hold %d KiB; want under 4 MiB", acks, size>>10, held>>10)
	}
	mtMarker(t, n, phone, "tel-ack-long-phone")
}

// TestLongUploadIDsKeepOnlyTheirBound: one phone opens the 8 uploads a
// device may have, each with a 1 MiB id and 4 bytes of data. Kept whole,
// the ids held 8 MiB outside the upload budget (127 MiB with 15 MiB ids);
// cut to 128 characters they hold little (the test allows 2 MiB), and each
// upload's id and metadata count against the edge's upload budget besides
// its 4 bytes. A second phone round-trips meanwhile, and the budget is
// whole again once the uploads' connection closes.
func TestLongUploadIDsKeepOnlyTheirBound(t *testing.T) {
	const uploads, size = 8, 1 << 20
	n := startNode(t, func(c *gateway.Config) { mdQuiet(c) })
	c, _ := n.connect(t, "tel-upload-long")
	phone, _ := n.connect(t, "tel-upload-long-phone")
	mtAlive(t, c)
	for i := range uploads {
		id := fmt.Sprintf("up-%d-", i)
		mdSendPart(t, c, id+strings.Repeat("x", size-len(id)), "document", []byte("data"), 0, 2)
		if i == uploads/2 {
			mtMarker(t, n, phone, "tel-upload-long-phone")
		}
	}
	mtAlive(t, c) // no error: every part stored
	if got := mdUploadBytes(t, n, "tel-upload-long"); got != uploads*4 {
		t.Fatalf("%d bytes buffered, want %d", got, uploads*4)
	}
	// 4 bytes, a 128-character id, the 256 bytes of an upload's entries
	// and about 100 bytes of metadata each.
	if _, _, u := n.Edge.BudgetsInUse(); u < uploads*(4+128+256) || u > uploads*(4+128+256+512) {
		t.Fatalf("the upload budget holds %d bytes for %d uploads of 4 bytes; want each one's id and metadata counted too", u, uploads)
	}
	mtMarker(t, n, phone, "tel-upload-long-phone")
	// What the uploads hold is what closing their connection frees.
	open := testsvc.LiveHeap(t)
	c.CloseNow()
	waitFor(t, "the closed connection's uploads given back", func() bool {
		_, _, u := n.Edge.BudgetsInUse()
		return u == 0 && mdUploadBytes(t, n, "tel-upload-long") == 0
	})
	held := open - testsvc.LiveHeap(t)
	t.Logf("%d uploads with %d KiB ids: closing them freed %d KiB", uploads, size>>10, held>>10)
	if held > 2<<20 {
		t.Fatalf("%d uploads with %d KiB ids hold %d KiB; want under 2 MiB", uploads, size>>10, held>>10)
	}
}
