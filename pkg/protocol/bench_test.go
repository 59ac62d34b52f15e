package protocol_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// Run with:
//
//	go test -run '^$' -bench . -benchmem -count 3 ./pkg/protocol
//
// SetBytes is always the size of the JSON frame on the wire (read by Decode,
// written by Append*), so MB/s is frame throughput.

// typicalText is a chat message of exactly 200 code points with some
// non-ASCII text, a quote and a newline.
var typicalText = func() string {
	s := "Привет! Can you check why the nightly build failed? The log says \"exit status 2\" in step 3.\n" +
		"Also remind me at 18:00 to call the dentist, and send the report to Eugene — thanks 🙂 "
	return protocol.Truncate(s+"See you tomorrow, have a good evening!", 200)
}()

var sinkFrame protocol.ClientFrame

func benchDecode(b *testing.B, msg []byte) {
	if f, e := protocol.Decode(msg); f == nil || e != nil {
		b.Fatalf("benchmark frame does not decode: %v", e)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		sinkFrame, _ = protocol.Decode(msg)
	}
}

func BenchmarkDecodeText(b *testing.B) {
	if n := utf8.RuneCountInString(typicalText); n != 200 {
		b.Fatalf("typical text has %d code points", n)
	}
	benchDecode(b, marshal(b, map[string]any{"t": "text", "id": "msg-01HV3K9Z8Q", "text": typicalText}))
}

func BenchmarkDecodeMedia3MiB(b *testing.B) {
	msg := marshal(b, map[string]any{
		"t": "media", "id": "file-01HV3K9Z8Q", "kind": "video", "mime": "video/mp4",
		"filename": "clip.mp4", "part": 0, "parts": 3, "data": b64(payload(protocol.MediaChunkBytes)),
	})
	if f, _ := protocol.Decode(msg); f == nil || len(f.(*protocol.MediaUp).Data) != 3<<20 {
		b.Fatal("benchmark frame does not carry exactly 3 MiB")
	}
	benchDecode(b, msg)
}

func benchEncode(b *testing.B, size int, enc func([]byte) []byte) {
	buf := make([]byte, 0, size)
	out := enc(buf)
	if !strings.HasPrefix(string(out[:8]), `{"t":"`) {
		b.Fatalf("unexpected frame %.40q", out)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		buf = enc(buf[:0])
	}
}

func BenchmarkEncodeMessage(b *testing.B) {
	m := protocol.Message{ID: "resp-01HV3K9Z8Q", Text: typicalText, Index: 0, Total: 1, Final: true}
	benchEncode(b, 4096, func(buf []byte) []byte { return protocol.AppendMessage(buf, m) })
}

func BenchmarkEncodeMedia3MiB(b *testing.B) {
	m := protocol.MediaChunk{
		ID: "file-01HV3K9Z8Q", Kind: "video", Mime: "video/mp4", Filename: "clip.mp4",
		Part: 0, Parts: 3, Size: 8 << 20, Data: payload(protocol.MediaChunkBytes),
	}
	benchEncode(b, protocol.MediaFrameSize(m), func(buf []byte) []byte { return protocol.AppendMedia(buf, m) })
}
