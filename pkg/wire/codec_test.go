package wire_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestCodec: the bus codec writes what a node of the earlier codec
// (encoding/json) writes for the same message, reads what it wrote, writes
// invalid UTF-8 as U+FFFD instead of failing, and matches member names
// exactly.
func TestCodec(t *testing.T) {
	msgs := []any{
		wire.Reply{OK: true},
		wire.Reply{Moved: true, Error: "device moved"},
		wire.Control{Op: wire.OpTakeover, Device: "tel-1", Epoch: 7},
		wire.Output{Op: wire.OpMessage, Device: "tel-1", Epoch: 3, ID: "m1", Text: "héllo", Final: true},
		wire.Output{Op: wire.OpMedia, Device: "tel-1", ID: "f", Media: &wire.MediaRef{Kind: "image", Mime: "image/png", Size: 10, Blob: "b"}},
		wire.Output{Op: wire.OpPrompt, Device: "tel-1", Prompt: &protocol.Prompt{ID: "p", Kind: "approval", Text: "ok?",
			Options: []protocol.Option{{ID: "y", Label: "Yes", Style: "primary"}}, Session: "mobile:tel-1", TimeoutSeconds: 60}},
		wire.Event{Kind: wire.EventText, Session: "mobile:tel-1", Device: "tel-1", ID: "t1", Text: "hi"},
	}
	for _, m := range msgs {
		got, err := wire.Marshal(m)
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", m, err)
		}
		old, _ := json.Marshal(m)
		if string(got) != string(old) {
			t.Errorf("Marshal(%T) = %s; encoding/json wrote %s", m, got, old)
		}
		back := reflect.New(reflect.TypeOf(m))
		if err := wire.Unmarshal(old, back.Interface()); err != nil {
			t.Fatalf("Unmarshal(%s): %v", old, err)
		}
		if !reflect.DeepEqual(back.Elem().Interface(), m) {
			t.Errorf("Unmarshal(%s) = %+v, want %+v", old, back.Elem().Interface(), m)
		}
	}

	cut := wire.Output{Op: wire.OpMessage, Device: "tel-1", Text: "cut \xe2\x82"}
	bad, err := wire.Marshal(cut)
	if err != nil {
		t.Fatalf("Marshal of invalid UTF-8: %v, want it replaced", err)
	}
	var out, old wire.Output
	oldBytes, _ := json.Marshal(cut)
	_ = json.Unmarshal(oldBytes, &old)
	if err := wire.Unmarshal(bad, &out); err != nil || !utf8.ValidString(out.Text) || out.Text != old.Text {
		t.Errorf("invalid UTF-8 came back as %q (%v), want %q as encoding/json has it", out.Text, err, old.Text)
	}

	var ctl wire.Control
	if err := wire.Unmarshal([]byte(`{"OP":"takeover","device":"tel-1","later":1}`), &ctl); err != nil || ctl.Op != "" || ctl.Device != "tel-1" {
		t.Errorf("Unmarshal = %+v, %v; want names matched exactly and unknown members ignored", ctl, err)
	}
}
