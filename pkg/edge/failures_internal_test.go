package edge

import (
	"testing"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestFailureFrames: every named failure is internal_error with its text
// as the message, the deliver's filled with its id and device, and each
// frame is a new one (fatal marks the frame it closes with).
func TestFailureFrames(t *testing.T) {
	for _, c := range []struct {
		f    failure
		args []any
		want string
	}{
		{failTextDedup, nil, "gateway storage unavailable; send again"},
		{failDeliverClosed, []any{"job-1"}, "deliver job-1: the gateway is shutting down; deliver it again"},
		{failDeliver, []any{"job-1", "tel-1"}, "deliver job-1 to tel-1 failed; deliver it again"},
	} {
		e := c.f.frame(c.args...)
		if e.Code != protocol.CodeInternalError || e.Message != c.want || e.Fatal {
			t.Errorf("%q.frame(%v) = %+v, want internal_error %q, not fatal", c.f, c.args, e, c.want)
		}
	}
	if first, second := failPanic.frame(), failPanic.frame(); first == second {
		t.Error("frame returned the same frame twice")
	}
}
