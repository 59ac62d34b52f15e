package edge

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// TestFrameOutReadsTheType counts frames of every header size (7-bit,
// 16-bit and 64-bit lengths) by the type in their payload, without
// allocating.
func TestFrameOutReadsTheType(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	et := newEdgeTelemetry(tel)

	small := textFrame(protocol.AppendPong(newFrame(32), nil))
	medium := textFrame(protocol.AppendMessage(newFrame(2000), protocol.Message{ID: "m", Text: strings.Repeat("a", 1000), Total: 1}))
	large := textFrame(protocol.AppendMessage(newFrame(70000), protocol.Message{ID: "m", Text: strings.Repeat("a", 70000), Total: 1}))
	if medium[1]&0x7f != 126 || large[1]&0x7f != 127 {
		t.Fatalf("length codes %d, %d: the frames do not cover the 16- and 64-bit headers", medium[1]&0x7f, large[1]&0x7f)
	}
	for _, f := range [][]byte{small, medium, large, closeFrame(1000, "bye"), nil} {
		et.frameOut(f)
	}
	if n := testing.AllocsPerRun(100, func() { et.frameOut(medium) }); n != 0 {
		t.Errorf("frameOut allocates %v times per frame", n)
	}

	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	// Messages: medium and large, then AllocsPerRun's warm-up and 100 runs.
	for _, want := range []string{`hermes_frames_out_total{type="pong"} 1`, `hermes_frames_out_total{type="message"} 103`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !strings.Contains(string(body), `hermes_frames_out_total{type="other"} 0`) {
		t.Error("a close frame or an empty marker was counted")
	}
}
