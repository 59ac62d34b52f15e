package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// Run a fuzzer with, for example:
//
//	go test -run '^$' -fuzz '^FuzzDecode$' -fuzztime 60s ./pkg/protocol
//
// A plain go test runs only the seeds below and those in testdata/fuzz.

// decodeSeeds are valid frames of every type, then broken ones.
var decodeSeeds = []string{
	`{"t":"hello","token":"tok","device":{"id":"tel-1","name":"Phone","platform":"android","app_version":"1.0.0"},"user":{"id":"u-1","name":"Eugene"}}`,
	`{"t":"HELLO","token":"tok"}`,
	`{"t":"text","id":"m1","text":"Привет 😀"}`,
	`{"t":"Text","id":"m2","text":"a\"b\\c\u2028\u0000"}`,
	`{"t":"audio","id":"a1","format":"wav","data":"UklGRg==","text":"hi"}`,
	`{"t":"audio","id":"a2","format":"OGG","data":"T2dnUw=="}`,
	`{"t":"media","id":"f1","kind":"image","mime":"image/png","filename":"a.png","caption":"cat","data":"iVBORw0KGgo=","part":0,"parts":1}`,
	`{"t":"media","id":"f2","kind":"document","filename":"r.pdf","data":"JVBERi0=","part":2047,"parts":2048}`,
	`{"t":"prompt","prompt_id":"p1","option_id":"once"}`,
	`{"t":"prompt","prompt_id":"p2","text":"custom answer"}`,
	`{"t":"typing"}`,
	`{"t":"ping","ts":1712345678901}`,
	`{"t":"ping","ts":{"a":[1,"x",null]}}`,
	`{"t":"ack","id":"m1"}`,
	`{"t":"deliver","id":"d1","target":"tel-1","text":"cron"}`,
	`{"t":"deliver","media":{"kind":"voice","mime":"audio/ogg","filename":"v.ogg","data":"T2dnUw=="}}`,
	`{"t":"push","kind":"fcm","token":"dGVzdA:APA91b-x_y"}`,
	`{"t":"Push","kind":"APNS","token":""}`,
	`{"t":"foo","text":5,"data":"!!"}`,
	// Broken.
	``,
	`{`,
	`[]`,
	`null`,
	`"text"`,
	`{}`,
	`{"t":1}`,
	`{"t":"text","id":"1","text":""}`,
	`{"t":"text","id":"1","text":5}`,
	"{\"t\":\"text\",\"id\":\"1\",\"text\":\"\xff\"}",
	`{"t":"text","id":"1","text":"\ud800"}`,
	`{"t":"audio","id":"a","format":"mp3","data":"YQ=="}`,
	`{"t":"audio","id":"a","format":"wav","data":"YQ"}`,
	`{"t":"media","id":"f","kind":"voice","data":"YQ=="}`,
	`{"t":"media","id":"f","kind":"image","data":"YQ==","part":3,"parts":3}`,
	`{"t":"media","id":"f","kind":"image","data":"YQ==","parts":2049}`,
	`{"t":"media","id":"f","kind":"image","data":"YQ==","part":-1}`,
	`{"t":"prompt","prompt_id":"p"}`,
	`{"t":"deliver","media":{"kind":"audio","data":"YQ=="}}`,
	`{"t":"deliver","media":{}}`,
	`{"t":"text","t":"foo","text":1}`,
	`{"t":"push","token":"x"}`,
	`{"t":"push","kind":"gcm","token":"x"}`,
	`{"t":"push","kind":"fcm","token":"a b"}`,
	`{"t":"text","id":"1","text":"x"} trailing`,
}

// decodeErrorCodes are the codes the specification gives to a malformed or
// oversized client frame; Decode must produce no other.
var decodeErrorCodes = map[protocol.Code]bool{
	protocol.CodeBadFrame:         true,
	protocol.CodeUnsupportedFrame: true,
	protocol.CodeTooBig:           true,
}

var clientTypes = map[string]bool{
	"hello": true, "text": true, "audio": true, "media": true, "prompt": true,
	"typing": true, "ping": true, "ack": true, "deliver": true, "push": true,
}

func FuzzDecode(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		in := bytes.Clone(msg)
		fr, err := protocol.Decode(msg)
		if !bytes.Equal(in, msg) {
			t.Fatalf("Decode modified its input")
		}
		if err != nil {
			var e *protocol.Error
			if !errors.As(err, &e) {
				t.Fatalf("Decode error %v is not a *protocol.Error", err)
			}
			if fr != nil {
				t.Fatalf("Decode returned both %#v and %v", fr, e)
			}
			if !decodeErrorCodes[e.Code] {
				t.Fatalf("Decode error code %q is not a frame validation code", e.Code)
			}
			if e.Fatal {
				t.Fatalf("Decode returned a fatal error %v", e)
			}
			if !utf8.ValidString(e.Message) || e.Message == "" {
				t.Fatalf("Decode error message %q", e.Message)
			}
			typ, ok := frameType(msg)
			if ok && !clientTypes[typ] {
				t.Fatalf("Decode returned %v for a frame of unknown type %q, want it ignored", e, typ)
			}
			if e.Code != protocol.CodeBadFrame && !ok {
				// Only a well-formed frame gets past bad_frame.
				t.Fatalf("%s for a frame that is not a well-formed JSON object with a type", e.Code)
			}
			return
		}
		typ, ok := frameType(msg)
		if fr == nil {
			if !ok || clientTypes[typ] {
				t.Fatalf("Decode ignored a frame that is not a well-formed object of an unknown type (t=%q)", typ)
			}
			return
		}
		if !ok || fr.Type() != typ {
			t.Fatalf("Decode returned a %s frame for t=%q", fr.Type(), typ)
		}
		checkFrame(t, fr)

		// Decoding the frame's own content again gives the same frame:
		// truncation and defaults are idempotent.
		if again := decodeOK(t, reencode(t, fr)); !reflect.DeepEqual(again, fr) {
			t.Fatalf("re-encoded frame decodes differently:\n got %#v\nwant %#v", again, fr)
		}

		// The frame does not alias msg.
		for i := range msg {
			msg[i] = 0
		}
		if again := decodeOK(t, in); !reflect.DeepEqual(again, fr) {
			t.Fatalf("frame changed when its input was overwritten")
		}
	})
}

// frameType is the lowercased t of a well-formed JSON object, as an
// independent parser (encoding/json, last duplicate wins) reads it. ok is
// false for anything Decode must reject as bad_frame.
func frameType(msg []byte) (typ string, ok bool) {
	if !utf8.Valid(msg) || !jsontext.Value(msg).IsValid(jsontext.AllowDuplicateNames(true)) {
		return "", false
	}
	var head map[string]any
	dec := json.NewDecoder(bytes.NewReader(msg))
	dec.UseNumber() // numbers beyond float64 are still valid JSON
	if dec.Decode(&head) != nil || head == nil {
		return "", false
	}
	t, isString := head["t"].(string)
	if !isString || t == "" {
		return "", false
	}
	return strings.ToLower(t), true
}

func runes(s string) int { return utf8.RuneCountInString(s) }

// checkFrame asserts the invariants every decoded frame holds.
func checkFrame(t *testing.T, fr protocol.ClientFrame) {
	t.Helper()
	str := func(name, s string, required bool, max int) {
		t.Helper()
		if !utf8.ValidString(s) {
			t.Fatalf("%s %s is not valid UTF-8: %q", fr.Type(), name, s)
		}
		if required && s == "" {
			t.Fatalf("%s %s is empty", fr.Type(), name)
		}
		if n := runes(s); max > 0 && n > max {
			t.Fatalf("%s %s has %d code points, limit %d", fr.Type(), name, n, max)
		}
	}
	data := func(name string, p []byte, max int) {
		t.Helper()
		if len(p) == 0 || len(p) > max {
			t.Fatalf("%s %s is %d bytes, want 1..%d", fr.Type(), name, len(p), max)
		}
	}
	switch f := fr.(type) {
	case *protocol.Hello:
		str("token", f.Token, false, 0)
		for _, s := range []string{f.Device.ID, f.Device.Name, f.Device.Platform, f.Device.AppVersion, f.User.ID, f.User.Name} {
			str("device/user field", s, false, protocol.MaxDeviceFieldChars)
		}
	case *protocol.Text:
		str("id", f.ID, true, protocol.MaxIDChars)
		str("text", f.Text, true, protocol.MaxTextChars)
	case *protocol.Audio:
		str("id", f.ID, true, protocol.MaxIDChars)
		if f.Format != "wav" && f.Format != "ogg" {
			t.Fatalf("audio format %q", f.Format)
		}
		data("data", f.Data, protocol.MaxAudioBytes)
		str("text", f.Text, false, protocol.MaxTextChars)
	case *protocol.MediaUp:
		str("id", f.ID, true, protocol.MaxIDChars)
		if !protocol.IsMediaIn(f.Kind) {
			t.Fatalf("media kind %q", f.Kind)
		}
		if f.Part < 0 || f.Part >= f.Parts || f.Parts > protocol.MaxMediaParts {
			t.Fatalf("media part %d of %d", f.Part, f.Parts)
		}
		data("data", f.Data, protocol.MaxMediaBytes)
		str("mime", f.Mime, true, 0)
		str("filename", f.Filename, false, protocol.MaxFilenameChars)
		str("caption", f.Caption, false, protocol.MaxTextChars)
	case *protocol.PromptAnswer:
		str("prompt_id", f.PromptID, true, 0)
		str("option_id", f.OptionID, f.Text == "", 0)
		str("text", f.Text, false, protocol.MaxTextChars)
	case *protocol.Typing:
	case *protocol.Ping:
		if f.TS != nil && !json.Valid(f.TS) {
			t.Fatalf("ping ts %q is not a JSON value", f.TS)
		}
		if pong := protocol.AppendPong(nil, f.TS); !json.Valid(pong) {
			t.Fatalf("pong %q is not valid JSON", pong)
		}
	case *protocol.Ack:
		str("id", f.ID, false, protocol.MaxIDChars)
	case *protocol.Deliver:
		str("id", f.ID, false, protocol.MaxIDChars)
		str("target", f.Target, false, 0)
		str("text", f.Text, f.Media == nil, protocol.MaxTextChars)
		if m := f.Media; m != nil {
			if !protocol.IsMediaOut(m.Kind) {
				t.Fatalf("deliver media kind %q", m.Kind)
			}
			data("media data", m.Data, protocol.MaxMediaBytes)
			str("media mime", m.Mime, true, 0)
			str("media filename", m.Filename, false, protocol.MaxFilenameChars)
		}
	case *protocol.Push:
		if f.Kind != protocol.PushFCM && f.Kind != protocol.PushAPNs {
			t.Fatalf("push kind %q", f.Kind)
		}
		if len(f.Token) > protocol.MaxPushTokenBytes || strings.ContainsFunc(f.Token, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			t.Fatalf("push token of %d bytes, not printable ASCII", len(f.Token))
		}
	default:
		t.Fatalf("unexpected frame type %T", fr)
	}
}

// reencode writes fr back as the client frame it came from.
func reencode(t *testing.T, fr protocol.ClientFrame) []byte {
	var m map[string]any
	switch f := fr.(type) {
	case *protocol.Hello:
		m = map[string]any{"token": f.Token, "device": f.Device, "user": f.User}
	case *protocol.Text:
		m = map[string]any{"id": f.ID, "text": f.Text}
	case *protocol.Audio:
		m = map[string]any{"id": f.ID, "format": f.Format, "data": f.Data, "text": f.Text}
	case *protocol.MediaUp:
		m = map[string]any{"id": f.ID, "kind": f.Kind, "mime": f.Mime, "filename": f.Filename,
			"caption": f.Caption, "data": f.Data, "part": f.Part, "parts": f.Parts}
	case *protocol.PromptAnswer:
		m = map[string]any{"prompt_id": f.PromptID, "option_id": f.OptionID, "text": f.Text}
	case *protocol.Typing:
		m = map[string]any{}
	case *protocol.Ping:
		// Built by hand: encoding/json would reformat a raw ts.
		if f.TS == nil {
			return []byte(`{"t":"ping"}`)
		}
		return []byte(`{"t":"ping","ts":` + string(f.TS) + `}`)
	case *protocol.Ack:
		m = map[string]any{"id": f.ID}
	case *protocol.Push:
		m = map[string]any{"kind": f.Kind, "token": f.Token}
	case *protocol.Deliver:
		m = map[string]any{"id": f.ID, "target": f.Target, "text": f.Text}
		if f.Media != nil {
			m["media"] = map[string]any{"kind": f.Media.Kind, "mime": f.Media.Mime, "filename": f.Media.Filename, "data": f.Media.Data}
		}
	}
	m["t"] = fr.Type()
	return marshal(t, m)
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{
		"", "plain", `"\`, "\x00\x1f\x7f", "\n\r\t\b\f", "Привет 😀", "\u2028\u2029",
		"\xff", "a\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\ufffd", "</script>&",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkAppendString(t, s) })
}

func FuzzSplitText(f *testing.F) {
	f.Add("", uint16(0))
	f.Add("hello world", uint16(3))
	f.Add(strings.Repeat("я", 10), uint16(4))
	f.Add("a😀b\xffc", uint16(1))
	f.Fuzz(func(t *testing.T, s string, lim uint16) {
		limit := int(lim % 64) // small limits split often; 0 means the default
		pieces := protocol.SplitText(s, limit)
		if limit == 0 {
			limit = protocol.DefaultChunkLimit
		}
		if strings.Join(pieces, "") != s {
			t.Fatalf("SplitText(%q, %d) = %q: does not concatenate to the input", s, limit, pieces)
		}
		n := runes(s)
		want := (n + limit - 1) / limit
		if want == 0 {
			want = 1
		}
		if len(pieces) != want {
			t.Fatalf("SplitText(%q, %d): %d pieces, want %d", s, limit, len(pieces), want)
		}
		for i, p := range pieces {
			if r := runes(p); r > limit || (i < len(pieces)-1 && r != limit) || (s != "" && r == 0) {
				t.Fatalf("SplitText(%q, %d): piece %d has %d code points", s, limit, i, r)
			}
		}
	})
}

func FuzzResolveOption(f *testing.F) {
	f.Add(uint8(0), "once", "", uint8(0))
	f.Add(uint8(1), "", "always", uint8(0))
	f.Add(uint8(2), "c2", "", uint8(3))
	f.Add(uint8(2), "c01", "", uint8(3))
	kinds := []string{protocol.PromptExecApproval, protocol.PromptSlashConfirm, protocol.PromptClarify}
	f.Fuzz(func(t *testing.T, k uint8, option, text string, n uint8) {
		kind := kinds[int(k)%len(kinds)]
		got := protocol.ResolveOption(kind, option, text, int(n))
		offered := map[string]bool{}
		choices := make([]string, n)
		for _, o := range protocol.PromptOptions(kind, choices) {
			offered[o.ID] = true
		}
		if !offered[got] {
			t.Fatalf("ResolveOption(%q, %q, %q, %d) = %q: not an option of the card", kind, option, text, n, got)
		}
		if offered[option] && got != option {
			t.Fatalf("ResolveOption(%q, %q, %q, %d) = %q: an offered option was replaced", kind, option, text, n, got)
		}
		if got != option && got != text && got != protocol.SafeOption(kind) {
			t.Fatalf("ResolveOption(%q, %q, %q, %d) = %q: neither the answer nor the safe option", kind, option, text, n, got)
		}
	})
}
