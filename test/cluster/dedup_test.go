//go:build unix

package cluster

import (
	"bytes"
	"encoding/base64"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestDedupAcrossEdges (c): a text id sent on edge A and sent again after
// the device moved to edge B reaches the agent once: the demo answers "You
// said:" once, and the next message's answer is the next thing the phone
// gets. A file id completed on B and uploaded again after moving back to A
// is not handed over again either.
func TestDedupAcrossEdges(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	dev := newDevice("tel")

	a := c.connect(t, "A", dev)
	if err := a.Text("m-1", "only once"); err != nil {
		t.Fatal(err)
	}
	readUntil(t, a, "the reply on A", finalText("You said: only once"))

	b := c.connect(t, "B", dev)
	expectClose(t, a, takeoverWithin, 1000)
	if err := b.Text("m-1", "only once"); err != nil { // the resend after a network drop
		t.Fatal(err)
	}
	if err := b.Text("m-2", "marker"); err != nil {
		t.Fatal(err)
	}
	fs := readUntil(t, b, "the marker's reply on B", finalText("You said: marker"))
	if ms := messages(fs); len(ms) != 1 {
		t.Errorf("on B, before the marker's reply: %q, want nothing (the agent saw m-1 again):%s", texts(ms), describe(fs))
	}
	if es := errorsIn(fs); len(es) > 0 {
		t.Errorf("errors on B: %v", es)
	}

	// A file, in three parts, completed on B: the demo sends it back once.
	data := bytes.Repeat([]byte("0123456789abcdef"), 640) // 10 KiB
	if err := b.UploadFile("f-1", "document", "text/plain", "notes.txt", "", data, 4096); err != nil {
		t.Fatal(err)
	}
	fs = readUntil(t, b, "the file sent back", func(f client.Frame) bool {
		return f.T() == protocol.TypeMedia && f.Str("reply_to") == "f-1"
	})
	echo := fs[len(fs)-1]
	got, err := base64.StdEncoding.DecodeString(echo.Str("data"))
	if err != nil || !bytes.Equal(got, data) || !echo.Bool("final") || echo.Str("filename") != "notes.txt" {
		t.Errorf("the file came back as %s (%d bytes, %v), want notes.txt with the same %d bytes in one final part",
			echo, len(got), err, len(data))
	}

	// Back on A, the same file id and the same text id are dropped.
	a2 := c.connect(t, "A", dev)
	expectClose(t, b, takeoverWithin, 1000)
	if err := a2.UploadFile("f-1", "document", "text/plain", "notes.txt", "", data, 4096); err != nil {
		t.Fatal(err)
	}
	if err := a2.Text("m-2", "marker"); err != nil {
		t.Fatal(err)
	}
	if err := a2.Text("m-3", "second marker"); err != nil {
		t.Fatal(err)
	}
	fs = readUntil(t, a2, "the second marker's reply on A", finalText("You said: second marker"))
	if ms := messages(fs); len(ms) != 1 {
		t.Errorf("on A again, before the second marker's reply: %q, want nothing:%s", texts(ms), describe(fs))
	}
	if media := ofType(fs, protocol.TypeMedia); len(media) > 0 {
		t.Errorf("on A again, the file came back again: %v", media)
	}
	if es := errorsIn(fs); len(es) > 0 {
		t.Errorf("errors on A: %v", es)
	}
}
