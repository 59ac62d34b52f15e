package gateway_test

// The edge's byte budgets are shared by all its sockets: a few hostile ones
// reach the bound, are refused with the protocol's error, and the others
// keep working.

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws/wsutil"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// padPing is a ping frame of exactly size bytes: the padding sits in a
// member the protocol ignores.
func padPing(ts string, size int) []byte {
	head := `{"t":"ping","ts":"` + ts + `","pad":"`
	return []byte(head + strings.Repeat("p", size-len(head)-2) + `"}`)
}

// TestReadBudget: with MaxReadBytes 1 MiB, a message of exactly 1 MiB is
// read and answered; 1 MiB + 1 is refused with a fatal internal_error. The
// budget holds what arrived, not what a header declares (see
// TestHeaderOnlySockets): a socket that sent all but one byte of a 700 KiB
// message holds 700 KiB, and another's 400 KiB
// message is refused while a third's small frames go on. Once the first
// message completes the budget is whole again.
func TestReadBudget(t *testing.T) {
	const limit = 1 << 20
	n := startNode(t, func(c *gateway.Config) { c.Edge.MaxReadBytes = limit })

	c, _ := n.connect(t, "tel-read-exact")
	mdSendRaw(t, c, padPing("exact", limit))
	if fs := mtReadUntil(t, c, "pong exact", func(f client.Frame) bool { return f.T() == protocol.TypePong }); fs[len(fs)-1].Str("ts") != "exact" {
		t.Fatalf("pong for %q", fs[len(fs)-1].Str("ts"))
	}
	c.SendRaw(padPing("over", limit+1)) // the edge may close before the payload is written
	hsExpectFatal(t, c, protocol.CodeInternalError, "a message one byte past the read budget")

	holder, _ := n.connect(t, "tel-read-holder")
	small, _ := n.connect(t, "tel-read-small")
	refused, _ := n.connect(t, "tel-read-refused")
	held := padPing("held", 700<<10)
	if err := holder.SendHeaderOnly(int64(len(held))); err != nil {
		t.Fatal(err)
	}
	if err := holder.SendPayload(held[:len(held)-1]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the holder's reservation", func() bool { r, _, _ := n.Edge.BudgetsInUse(); return r == int64(len(held)) })
	refused.SendRaw(padPing("refused", 400<<10)) // the edge may close before the payload is written
	hsExpectFatal(t, refused, protocol.CodeInternalError, "a message past what another socket holds")
	mtAlive(t, small)
	if err := holder.SendPayload(held[len(held)-1:]); err != nil {
		t.Fatal(err)
	}
	mtReadUntil(t, holder, "pong held", func(f client.Frame) bool { return f.T() == protocol.TypePong && f.Str("ts") == "held" })
	waitFor(t, "the read budget released", func() bool { r, _, _ := n.Edge.BudgetsInUse(); return r == 0 })
	again, _ := n.connect(t, "tel-read-again")
	mdSendRaw(t, again, padPing("again", limit))
	mtReadUntil(t, again, "pong again", func(f client.Frame) bool { return f.T() == protocol.TypePong && f.Str("ts") == "again" })
}

// TestUploadBudget: with MaxUploadBytes 2 MiB, one device's open part of
// exactly 2 MiB with its upload's id and metadata is stored (a byte more
// is refused); another device's first byte then gets a
// non-fatal internal_error and is not stored. When the first file
// completes its bytes are given back and the refused part, sent again, is
// taken (with its upload's id and metadata); a connection that closes
// gives back what its uploads held.
func TestUploadBudget(t *testing.T) {
	const limit = 2 * mdMiB
	n := startNode(t, func(c *gateway.Config) { c.Edge.MaxUploadBytes = limit; mdQuiet(c) })
	a, _ := n.connect(t, "tel-upb-a")
	b, _ := n.connect(t, "tel-upb-b")
	file := mdBytes(limit+5, 81)
	cut := limit - mdUploadCharge("upb-1", "document") // the upload's id and metadata count too
	mdSendPart(t, a, "upb-1", "document", file[:cut+1], 0, 2)
	mtExpectError(t, a, protocol.CodeInternalError)
	mdSendPart(t, a, "upb-1", "document", file[:cut], 0, 2)
	mtAlive(t, a)
	if got := mdUploadBytes(t, n, "tel-upb-a"); got != cut {
		t.Fatalf("%d bytes buffered, want exactly %d", got, cut)
	}
	mdSendPart(t, b, "upb-2", "document", []byte{1}, 0, 2)
	mtExpectError(t, b, protocol.CodeInternalError)
	if got := mdUploadBytes(t, n, "tel-upb-b"); got != 0 {
		t.Fatalf("the refused part was stored: %d bytes", got)
	}
	mdSendPart(t, a, "upb-1", "document", file[cut:], 1, 2)
	mtAlive(t, a)
	if _, got := mdAgentFile(t, n, "tel-upb-a", "upb-1"); !bytes.Equal(got, file) {
		t.Fatalf("the agent got %d other bytes", len(got))
	}
	if _, _, u := n.Edge.BudgetsInUse(); u != 0 {
		t.Fatalf("the completed file still holds %d bytes of the budget", u)
	}
	mdSendPart(t, b, "upb-2", "document", []byte{1}, 0, 2)
	mtAlive(t, b)
	if _, _, u := n.Edge.BudgetsInUse(); u != 1+int64(mdUploadCharge("upb-2", "document")) {
		t.Fatalf("budget holds %d bytes, want the 1 of the part sent again and what its upload's id and metadata hold", u)
	}
	b.CloseNow()
	waitFor(t, "the closed connection's upload given back", func() bool { _, _, u := n.Edge.BudgetsInUse(); return u == 0 })
}

// mdUploadCharge is what an upload sent by mdSendPart holds of the edge's
// upload budget besides its bytes: its entries (256 bytes), its id and
// its metadata as the store keeps it.
func mdUploadCharge(id, kind string) int {
	meta, _ := json.Marshal(map[string]string{"kind": kind, "mime": "application/octet-stream", "filename": id + ".bin", "caption": ""})
	return 256 + len(id) + len(meta)
}

// waitFor polls cond until it holds, failing the test after a generous
// bound.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testsvc.WaitFor(t, 20*time.Second, what, cond)
}

// TestQueueBudget: with MaxQueuedBytes 2 MiB and an hour's write timeout,
// a phone that stops reading while the echo of a 3 MiB file is queued to it
// is closed as a slow reader once the edge's queues pass the budget (its
// own bound, 32 MiB, is far away), while a phone that reads, holding less
// than 1 MiB, keeps its traffic; the budget is whole again afterwards.
func TestQueueBudget(t *testing.T) {
	n := startNode(t, func(c *gateway.Config) { c.Edge.MaxQueuedBytes = 2 * mdMiB; c.Edge.WriteTimeout = time.Hour })
	reader, _ := n.connect(t, "tel-queue-reader")
	nc, _ := srDial(t, n, "tel-queue-stalled")
	if err := wsutil.WriteClientText(nc, mdRaw(map[string]any{"t": "media", "id": "queue-1", "kind": "document",
		"mime": "application/octet-stream", "filename": "big.bin"}, mdBytes(3*mdMiB, 12))); err != nil {
		t.Fatalf("upload: %v", err)
	}
	waitFor(t, "the stalled phone closed as a slow reader", func() bool { return n.Edge.Conns() == 1 })
	mtAlive(t, reader)
	mtMarker(t, n, reader, "tel-queue-reader")
	waitFor(t, "the queue budget released", func() bool { _, q, _ := n.Edge.BudgetsInUse(); return q == 0 })
}

// TestBlobCapOnRedis: the media kept for the agent is bounded in Redis as
// in memory (Config.MaxBlobBytes): with 1 MiB, a file of exactly 1 MiB is
// kept and handed on; the next byte gets internal_error while it lives.
func TestBlobCapOnRedis(t *testing.T) {
	natsURL, redisURL := clusterURLs(t)
	prefix := randomPrefix()
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.NATSURL, cfg.RedisURL, cfg.RedisPrefix = natsURL, redisURL, prefix
		cfg.NATSPrefix = strings.NewReplacer(":", ".", "-", "_").Replace(prefix)
		cfg.MaxBlobBytes = mdMiB
		mdQuiet(cfg)
	})
	c, _ := n.connect(t, "tel-blob-cap")
	data := mdBytes(mdMiB, 91)
	mdSendRaw(t, c, mdRaw(map[string]any{"t": "media", "id": "cap-1", "kind": "document", "mime": "application/octet-stream", "filename": "a.bin"}, data))
	mtAlive(t, c)
	if ev, got := mdAgentFile(t, n, "tel-blob-cap", "cap-1"); ev.Media.Size != mdMiB || !bytes.Equal(got, data) {
		t.Fatalf("the agent got %d bytes, want the %d sent", ev.Media.Size, mdMiB)
	}
	mdSendRaw(t, c, mdRaw(map[string]any{"t": "media", "id": "cap-2", "kind": "document", "mime": "application/octet-stream", "filename": "b.bin"}, []byte{7}))
	if f := mtExpectError(t, c, protocol.CodeInternalError); !strings.Contains(f.Str("message"), "full") {
		t.Fatalf("the error does not say the store is full: %s", f)
	}
}
