package protocol_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// Test helpers shared by the test files of this package.

// marshal encodes a frame built as a map, so long or unusual strings need no
// hand escaping.
func marshal(t testing.TB, m map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("marshal test frame: %v", err)
	}
	return b
}

// b64 is the standard base64 a client puts in data.
func b64(p []byte) string { return base64.StdEncoding.EncodeToString(p) }

// payload returns n deterministic bytes covering every byte value.
func payload(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + i>>8)
	}
	return p
}

// decodeOK decodes msg and fails unless it is a frame.
func decodeOK(t *testing.T, msg []byte) protocol.ClientFrame {
	t.Helper()
	f, e := protocol.Decode(msg)
	if e != nil {
		t.Fatalf("Decode(%.200s) = error %v, want a frame", msg, e)
	}
	if f == nil {
		t.Fatalf("Decode(%.200s) ignored the frame, want a frame", msg)
	}
	return f
}

// decodeErr decodes msg and fails unless it is a non-fatal error with code.
func decodeErr(t *testing.T, msg []byte, code protocol.Code) {
	t.Helper()
	f, err := protocol.Decode(msg)
	var e *protocol.Error
	if !errors.As(err, &e) {
		t.Fatalf("Decode(%.200s) = (%#v, %v), want a *protocol.Error %s", msg, f, err, code)
	}
	if f != nil {
		t.Errorf("Decode(%.200s) returned frame %#v together with error %v", msg, f, e)
	}
	if e.Code != code {
		t.Errorf("Decode(%.200s) code = %s (%s), want %s", msg, e.Code, e.Message, code)
	}
	if e.Fatal {
		t.Errorf("Decode(%.200s) error %v is fatal; Decode errors must not be", msg, e)
	}
	if e.Message == "" {
		t.Errorf("Decode(%.200s) error %s has no message", msg, e.Code)
	}
}

// result is what a table row expects from Decode: a frame or an error code.
type result struct {
	frame protocol.ClientFrame
	code  protocol.Code
}

func check(t *testing.T, msg []byte, want result) protocol.ClientFrame {
	t.Helper()
	if want.code != "" {
		decodeErr(t, msg, want.code)
		return nil
	}
	got := decodeOK(t, msg)
	if want.frame != nil && !reflect.DeepEqual(got, want.frame) {
		t.Errorf("Decode(%.200s)\n got %#v\nwant %#v", msg, got, want.frame)
	}
	return got
}

func wantFrame(f protocol.ClientFrame) result { return result{frame: f} }
func fails(c protocol.Code) result            { return result{code: c} }

// anyFrame accepts any frame without comparing it.
var anyFrame = result{}

func TestDecodeEveryFrameType(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		want protocol.ClientFrame
	}{
		{"hello", `{"t":"hello","token":"tok","device":{"id":"tel-1","name":"Phone","platform":"android","app_version":"1.0.0"},"user":{"id":"u-1","name":"Eugene"}}`,
			&protocol.Hello{Token: "tok", Device: protocol.Device{ID: "tel-1", Name: "Phone", Platform: "android", AppVersion: "1.0.0"}, User: protocol.User{ID: "u-1", Name: "Eugene"}}},
		{"hello without device", `{"t":"hello","token":"tok"}`, &protocol.Hello{Token: "tok"}},
		{"text", `{"t":"text","id":"m1","text":"Привет, world"}`, &protocol.Text{ID: "m1", Text: "Привет, world"}},
		{"audio", `{"t":"audio","id":"a1","format":"ogg","data":"YWJj","text":"abc"}`,
			&protocol.Audio{ID: "a1", Format: "ogg", Data: []byte("abc"), Text: "abc"}},
		{"media", `{"t":"media","id":"f1","kind":"document","mime":"text/plain","filename":"a.txt","caption":"see","data":"YWJj","part":1,"parts":3}`,
			&protocol.MediaUp{ID: "f1", Kind: "document", Mime: "text/plain", Filename: "a.txt", Caption: "see", Data: []byte("abc"), Part: 1, Parts: 3}},
		{"prompt", `{"t":"prompt","prompt_id":"p1","option_id":"once","text":"ok"}`,
			&protocol.PromptAnswer{PromptID: "p1", OptionID: "once", Text: "ok"}},
		{"typing", `{"t":"typing"}`, &protocol.Typing{}},
		{"ping", `{"t":"ping","ts":17}`, &protocol.Ping{TS: []byte("17")}},
		{"ping without ts", `{"t":"ping"}`, &protocol.Ping{}},
		{"ack", `{"t":"ack","id":"m9"}`, &protocol.Ack{ID: "m9"}},
		{"deliver text", `{"t":"deliver","id":"d1","target":"tel-1","text":"cron says hi"}`,
			&protocol.Deliver{ID: "d1", Target: "tel-1", Text: "cron says hi"}},
		{"deliver media", `{"t":"deliver","id":"d2","media":{"kind":"voice","mime":"audio/ogg","filename":"v.ogg","data":"YWJj"}}`,
			&protocol.Deliver{ID: "d2", Media: &protocol.DeliverMedia{Kind: "voice", Mime: "audio/ogg", Filename: "v.ogg", Data: []byte("abc")}}},
		{"push", `{"t":"push","kind":"fcm","token":"dGVzdA:APA91b-x_y"}`, &protocol.Push{Kind: "fcm", Token: "dGVzdA:APA91b-x_y"}},
		{"push removal", `{"t":"push","kind":"apns","token":""}`, &protocol.Push{Kind: "apns"}},
		{"unknown members ignored", `{"t":"text","id":"m1","text":"x","extra":{"deep":[1,2,{"x":null}]},"v":1}`,
			&protocol.Text{ID: "m1", Text: "x"}},
		{"member names are exact", `{"t":"text","id":"m1","text":"x","TEXT":"y","Id":"z"}`,
			&protocol.Text{ID: "m1", Text: "x"}},
		{"repeated member keeps the last", `{"t":"text","id":"m1","text":"a","text":"b"}`,
			&protocol.Text{ID: "m1", Text: "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := check(t, []byte(tt.msg), wantFrame(tt.want))
			if got != nil && got.Type() != tt.want.Type() {
				t.Errorf("Type() = %q, want %q", got.Type(), tt.want.Type())
			}
		})
	}
}

func TestDecodeTypeIsCaseInsensitive(t *testing.T) {
	frames := map[string]string{
		"hello":   `"token":"x"`,
		"text":    `"id":"1","text":"x"`,
		"audio":   `"id":"1","format":"wav","data":"YQ=="`,
		"media":   `"id":"1","kind":"image","data":"YQ=="`,
		"prompt":  `"prompt_id":"p","option_id":"once"`,
		"typing":  ``,
		"ping":    `"ts":1`,
		"ack":     `"id":"1"`,
		"deliver": `"text":"x"`,
	}
	for typ, members := range frames {
		for _, spelled := range []string{typ, strings.ToUpper(typ), strings.ToUpper(typ[:1]) + typ[1:], mixCase(typ)} {
			msg := `{"t":"` + spelled + `"`
			if members != "" {
				msg += "," + members
			}
			msg += "}"
			t.Run(spelled, func(t *testing.T) {
				f := decodeOK(t, []byte(msg))
				if f.Type() != typ {
					t.Errorf("Decode(%s).Type() = %q, want %q", msg, f.Type(), typ)
				}
			})
		}
	}
}

// mixCase upper-cases every other letter: "media" → "MeDiA".
func mixCase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i%2 == 0 {
			r = []rune(strings.ToUpper(string(r)))[0]
		}
		b.WriteRune(r)
	}
	return b.String()
}

func TestDecodeUnknownTypeIsIgnored(t *testing.T) {
	for _, msg := range []string{
		`{"t":"foo"}`,
		`{"t":"FOO","id":"1"}`,
		`{"t":"delivered","id":"x","device":"tel-1"}`,
		// Server frame types are unknown when a client sends them.
		`{"t":"ready","v":1}`,
		`{"t":"message","id":1,"text":false,"chunk":"x"}`,
		`{"t":"pong","ts":1}`,
		`{"t":"prompt_done","id":"p"}`,
		`{"t":"avatar","state":"idle"}`,
		`{"t":"error","code":{},"message":[1],"fatal":"yes"}`,
		// Members that would not fit any known frame must not turn an unknown
		// frame into bad_frame.
		`{"t":"foo","text":5,"id":{},"token":[],"device":"phone","user":7}`,
		`{"t":"foo","data":"!!! not base64 !!!","parts":"many","part":1.5}`,
		`{"t":"foo","media":[1,2,3],"format":null,"kind":true}`,
		`{"t":"foo","parts":123456789012345678901234567890}`,
		`{"t":" text"}`,
		`{"t":"text2","id":"1","text":"x"}`,
	} {
		t.Run(msg, func(t *testing.T) {
			f, e := protocol.Decode([]byte(msg))
			if f != nil || e != nil {
				t.Errorf("Decode(%s) = (%#v, %v), want (nil, nil)", msg, f, e)
			}
		})
	}
}

func TestDecodeBadFrame(t *testing.T) {
	tests := []struct {
		name string
		msg  string
	}{
		{"empty message", ``},
		{"whitespace", "  \n"},
		{"not JSON", `hello`},
		{"unterminated object", `{"t":"text","id":"1","text":"x"`},
		{"trailing comma", `{"t":"text","id":"1","text":"x",}`},
		{"trailing garbage", `{"t":"text","id":"1","text":"x"} {}`},
		{"single quotes", `{'t':'text'}`},
		{"not UTF-8 in a string", "{\"t\":\"text\",\"id\":\"1\",\"text\":\"caf\xe9\"}"},
		{"not UTF-8 in an unknown frame", "{\"t\":\"foo\",\"x\":\"\xff\xfe\"}"},
		{"not UTF-8 outside strings", "{\"t\":\"text\"}\xff"},
		{"lone surrogate escape", `{"t":"text","id":"1","text":"\ud800"}`},
		{"array", `[{"t":"text","id":"1","text":"x"}]`},
		{"string", `"text"`},
		{"number", `42`},
		{"boolean", `true`},
		{"null", `null`},
		{"missing t", `{"id":"1","text":"x"}`},
		{"empty object", `{}`},
		{"empty t", `{"t":"","id":"1","text":"x"}`},
		{"null t", `{"t":null,"id":"1","text":"x"}`},
		{"empty t and a member of the wrong type", `{"t":"","text":0}`},
		{"missing t and a member of the wrong type", `{"id":"1","text":0}`},
		{"t is a number", `{"t":1}`},
		{"t is an array", `{"t":["text"]}`},
		{"t is an object", `{"t":{"type":"text"}}`},
		{"upper-case member T only", `{"T":"text","id":"1","text":"x"}`},
		{"text is a number", `{"t":"text","id":"1","text":5}`},
		{"id is a number", `{"t":"text","id":1,"text":"x"}`},
		{"device is a string", `{"t":"hello","token":"x","device":"phone"}`},
		{"device.id is a number", `{"t":"hello","token":"x","device":{"id":1}}`},
		{"data is an array", `{"t":"audio","id":"1","format":"wav","data":[1,2]}`},
		{"deliver media is a string", `{"t":"deliver","text":"x","media":"YQ=="}`},
		{"prompt_id is an object", `{"t":"prompt","prompt_id":{},"option_id":"once"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { decodeErr(t, []byte(tt.msg), protocol.CodeBadFrame) })
	}
}

// idFrames build a frame of every type that carries a client id.
var idFrames = map[string]func(id string) string{
	"text":    func(id string) string { return `{"t":"text","id":` + quote(id) + `,"text":"x"}` },
	"audio":   func(id string) string { return `{"t":"audio","id":` + quote(id) + `,"format":"wav","data":"YQ=="}` },
	"media":   func(id string) string { return `{"t":"media","id":` + quote(id) + `,"kind":"image","data":"YQ=="}` },
	"ack":     func(id string) string { return `{"t":"ack","id":` + quote(id) + `}` },
	"deliver": func(id string) string { return `{"t":"deliver","id":` + quote(id) + `,"text":"x"}` },
	"prompt":  func(id string) string { return `{"t":"prompt","prompt_id":` + quote(id) + `,"option_id":"once"}` },
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func frameID(f protocol.ClientFrame) string {
	switch f := f.(type) {
	case *protocol.Text:
		return f.ID
	case *protocol.Audio:
		return f.ID
	case *protocol.MediaUp:
		return f.ID
	case *protocol.Ack:
		return f.ID
	case *protocol.Deliver:
		return f.ID
	case *protocol.PromptAnswer:
		return f.PromptID
	}
	panic("frame without id")
}

func TestDecodeIDTruncatedTo128CodePoints(t *testing.T) {
	tests := []struct {
		name string
		id   string
		want string
	}{
		{"short", "m-1", "m-1"},
		{"128 ASCII stays", strings.Repeat("a", 128), strings.Repeat("a", 128)},
		{"129 ASCII cut", strings.Repeat("a", 128) + "b", strings.Repeat("a", 128)},
		{"128 Cyrillic stays", strings.Repeat("я", 128), strings.Repeat("я", 128)},
		{"129 Cyrillic cut", strings.Repeat("я", 129), strings.Repeat("я", 128)},
		{"129 emoji cut", strings.Repeat("😀", 129), strings.Repeat("😀", 128)},
		{"mixed cut after a multibyte rune", strings.Repeat("a", 127) + "€" + "zzz", strings.Repeat("a", 127) + "€"},
		{"long", strings.Repeat("€", 10000), strings.Repeat("€", 128)},
	}
	for typ, build := range idFrames {
		for _, tt := range tests {
			t.Run(typ+"/"+tt.name, func(t *testing.T) {
				got := frameID(decodeOK(t, []byte(build(tt.id))))
				if got != tt.want {
					t.Errorf("id = %q (%d code points), want %d code points", got, utf8.RuneCountInString(got), utf8.RuneCountInString(tt.want))
				}
			})
		}
	}
}

func TestDecodeIDRequired(t *testing.T) {
	for _, typ := range []string{"text", "audio", "media"} {
		t.Run(typ, func(t *testing.T) {
			msg := strings.Replace(idFrames[typ]("x"), `"id":"x",`, "", 1)
			if strings.Contains(msg, `"id"`) {
				t.Fatalf("test frame still has an id: %s", msg)
			}
			decodeErr(t, []byte(msg), protocol.CodeBadFrame)
			decodeErr(t, []byte(idFrames[typ]("")), protocol.CodeBadFrame)
		})
	}
}

func TestDecodeDeviceFieldsTruncatedTo120(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"120 stays", strings.Repeat("d", 120), strings.Repeat("d", 120)},
		{"121 cut", strings.Repeat("d", 121), strings.Repeat("d", 120)},
		{"120 multibyte stays", strings.Repeat("ж", 120), strings.Repeat("ж", 120)},
		{"121 multibyte cut", strings.Repeat("ж", 121), strings.Repeat("ж", 120)},
		{"4-byte runes cut", strings.Repeat("𝄞", 500), strings.Repeat("𝄞", 120)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := marshal(t, map[string]any{"t": "hello", "token": "tok", "device": map[string]any{
				"id": tt.in, "name": tt.in, "platform": tt.in, "app_version": tt.in,
			}})
			h := decodeOK(t, msg).(*protocol.Hello)
			want := protocol.Device{ID: tt.want, Name: tt.want, Platform: tt.want, AppVersion: tt.want}
			if h.Device != want {
				t.Errorf("device fields have %d/%d/%d/%d code points, want %d each",
					utf8.RuneCountInString(h.Device.ID), utf8.RuneCountInString(h.Device.Name),
					utf8.RuneCountInString(h.Device.Platform), utf8.RuneCountInString(h.Device.AppVersion),
					utf8.RuneCountInString(tt.want))
			}
			if h.Token != "tok" {
				t.Errorf("token = %q, want tok", h.Token)
			}
		})
	}
}

func TestDecodeFilenameTruncatedTo200(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"200 stays", strings.Repeat("f", 196) + ".pdf", strings.Repeat("f", 196) + ".pdf"},
		{"201 cut", strings.Repeat("f", 201), strings.Repeat("f", 200)},
		{"200 multibyte stays", strings.Repeat("ф", 200), strings.Repeat("ф", 200)},
		{"201 multibyte cut", strings.Repeat("ф", 201), strings.Repeat("ф", 200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := decodeOK(t, marshal(t, map[string]any{"t": "media", "id": "f", "kind": "document", "filename": tt.in, "data": "YQ=="})).(*protocol.MediaUp)
			if up.Filename != tt.want {
				t.Errorf("media filename has %d code points, want %d", utf8.RuneCountInString(up.Filename), utf8.RuneCountInString(tt.want))
			}
			d := decodeOK(t, marshal(t, map[string]any{"t": "deliver", "media": map[string]any{"kind": "document", "filename": tt.in, "data": "YQ=="}})).(*protocol.Deliver)
			if d.Media.Filename != tt.want {
				t.Errorf("deliver filename has %d code points, want %d", utf8.RuneCountInString(d.Media.Filename), utf8.RuneCountInString(tt.want))
			}
		})
	}
}

// textCases are the MaxTextChars boundaries, shared by every text-like field.
var textCases = []struct {
	name string
	text string
	want result
}{
	{"one char", "x", anyFrame},
	{"12000 ASCII", strings.Repeat("a", 12000), anyFrame},
	{"12001 ASCII", strings.Repeat("a", 12001), fails(protocol.CodeTooBig)},
	{"12000 two-byte runes", strings.Repeat("я", 12000), anyFrame},
	{"12001 two-byte runes", strings.Repeat("я", 12001), fails(protocol.CodeTooBig)},
	{"12000 four-byte runes", strings.Repeat("😀", 12000), anyFrame},
	{"12001 four-byte runes", strings.Repeat("😀", 12001), fails(protocol.CodeTooBig)},
	{"11999 ASCII and one emoji", strings.Repeat("a", 11999) + "😀", anyFrame},
	{"12000 ASCII and one emoji", strings.Repeat("a", 12000) + "😀", fails(protocol.CodeTooBig)},
}

func TestDecodeTextLimit(t *testing.T) {
	fields := []struct {
		name  string
		frame func(text string) map[string]any
		got   func(protocol.ClientFrame) string
	}{
		{"text.text",
			func(s string) map[string]any { return map[string]any{"t": "text", "id": "1", "text": s} },
			func(f protocol.ClientFrame) string { return f.(*protocol.Text).Text }},
		{"media.caption",
			func(s string) map[string]any {
				return map[string]any{"t": "media", "id": "1", "kind": "image", "data": "YQ==", "caption": s}
			},
			func(f protocol.ClientFrame) string { return f.(*protocol.MediaUp).Caption }},
		{"audio.text",
			func(s string) map[string]any {
				return map[string]any{"t": "audio", "id": "1", "format": "wav", "data": "YQ==", "text": s}
			},
			func(f protocol.ClientFrame) string { return f.(*protocol.Audio).Text }},
		{"prompt.text",
			func(s string) map[string]any { return map[string]any{"t": "prompt", "prompt_id": "p", "text": s} },
			func(f protocol.ClientFrame) string { return f.(*protocol.PromptAnswer).Text }},
		{"deliver.text",
			func(s string) map[string]any { return map[string]any{"t": "deliver", "text": s} },
			func(f protocol.ClientFrame) string { return f.(*protocol.Deliver).Text }},
	}
	for _, field := range fields {
		for _, tt := range textCases {
			t.Run(field.name+"/"+tt.name, func(t *testing.T) {
				f := check(t, marshal(t, field.frame(tt.text)), tt.want)
				if f != nil && field.got(f) != tt.text {
					t.Errorf("%s was changed by Decode", field.name)
				}
			})
		}
	}
}

func TestDecodeTextRequired(t *testing.T) {
	for _, msg := range []string{
		`{"t":"text","id":"1","text":""}`,
		`{"t":"text","id":"1"}`,
		`{"t":"text","id":"1","text":null}`,
	} {
		t.Run(msg, func(t *testing.T) { decodeErr(t, []byte(msg), protocol.CodeBadFrame) })
	}
}

// Large payloads shared by the size tests: base64 of exactly MaxAudioBytes /
// MaxMediaBytes and one byte more.
// They are built on first use so fuzzing and benchmarks do not pay for them.
var (
	b64At8MiB     = sync.OnceValue(func() string { return b64(payload(8 << 20)) })
	b64Over8MiB   = sync.OnceValue(func() string { return b64(payload(8<<20 + 1)) })
	b64At8MiBData = sync.OnceValue(func() []byte { return payload(8 << 20) })
)

func TestDecodeAudio(t *testing.T) {
	audio := func(format string, data any) map[string]any {
		m := map[string]any{"t": "audio", "id": "a1", "format": format}
		if data != nil {
			m["data"] = data
		}
		return m
	}
	tests := []struct {
		name   string
		frame  map[string]any
		want   result
		format string
	}{
		{"wav", audio("wav", "YWJj"), anyFrame, "wav"},
		{"ogg", audio("ogg", "YWJj"), anyFrame, "ogg"},
		{"WAV", audio("WAV", "YWJj"), anyFrame, "wav"},
		{"Ogg", audio("Ogg", "YWJj"), anyFrame, "ogg"},
		{"mp3", audio("mp3", "YWJj"), fails(protocol.CodeUnsupportedFrame), ""},
		{"opus", audio("opus", "YWJj"), fails(protocol.CodeUnsupportedFrame), ""},
		{"wav with space", audio("wav ", "YWJj"), fails(protocol.CodeUnsupportedFrame), ""},
		{"audio/ogg", audio("audio/ogg", "YWJj"), fails(protocol.CodeUnsupportedFrame), ""},
		{"missing format", map[string]any{"t": "audio", "id": "a1", "data": "YWJj"}, fails(protocol.CodeBadFrame), ""},
		{"missing data", audio("wav", nil), fails(protocol.CodeBadFrame), ""},
		{"empty data", audio("wav", ""), fails(protocol.CodeBadFrame), ""},
		{"null data", map[string]any{"t": "audio", "id": "a1", "format": "wav", "data": nil}, fails(protocol.CodeBadFrame), ""},
		{"base64 with bad characters", audio("wav", "!!!!"), fails(protocol.CodeBadFrame), ""},
		{"base64 with bad length", audio("wav", "YWJ"), fails(protocol.CodeBadFrame), ""},
		{"base64 without padding", audio("wav", "YQ"), fails(protocol.CodeBadFrame), ""},
		{"URL-safe base64", audio("wav", "-_-_"), fails(protocol.CodeBadFrame), ""},
		{"base64 with a newline", audio("wav", "YW\nJj"), fails(protocol.CodeBadFrame), ""},
		{"exactly 8 MiB", audio("wav", b64At8MiB()), anyFrame, "wav"},
		{"8 MiB + 1 byte", audio("wav", b64Over8MiB()), fails(protocol.CodeTooBig), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := check(t, marshal(t, tt.frame), tt.want)
			if f == nil {
				return
			}
			a := f.(*protocol.Audio)
			if a.Format != tt.format {
				t.Errorf("format = %q, want %q", a.Format, tt.format)
			}
			data, _ := tt.frame["data"].(string)
			want, _ := base64.StdEncoding.DecodeString(data)
			if !bytes.Equal(a.Data, want) {
				t.Errorf("data = %d bytes, want %d decoded bytes", len(a.Data), len(want))
			}
		})
	}
}

func TestDecodeMediaKind(t *testing.T) {
	tests := []struct {
		kind string
		want result
	}{
		{"image", anyFrame},
		{"video", anyFrame},
		{"document", anyFrame},
		{"audio", anyFrame},
		{"voice", fails(protocol.CodeUnsupportedFrame)},
		{"animation", fails(protocol.CodeUnsupportedFrame)},
		{"sticker", fails(protocol.CodeUnsupportedFrame)},
		{"other", fails(protocol.CodeUnsupportedFrame)},
		{"", fails(protocol.CodeBadFrame)},
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			f := check(t, marshal(t, map[string]any{"t": "media", "id": "f", "kind": tt.kind, "data": "YQ=="}), tt.want)
			if f != nil && f.(*protocol.MediaUp).Kind != tt.kind {
				t.Errorf("kind = %q, want %q", f.(*protocol.MediaUp).Kind, tt.kind)
			}
		})
	}
}

func TestDecodeMediaParts(t *testing.T) {
	tests := []struct {
		name        string
		members     string // raw JSON members after data
		want        result
		part, parts int
	}{
		{"defaults", ``, anyFrame, 0, 1},
		{"null part and parts take defaults", `,"part":null,"parts":null`, anyFrame, 0, 1},
		{"parts 1 part 0", `,"part":0,"parts":1`, anyFrame, 0, 1},
		{"parts 3 last part", `,"part":2,"parts":3`, anyFrame, 2, 3},
		{"parts 2048 last part", `,"part":2047,"parts":2048`, anyFrame, 2047, 2048},
		{"parts 2048 first part", `,"parts":2048`, anyFrame, 0, 2048},
		{"parts 0", `,"parts":0`, fails(protocol.CodeBadFrame), 0, 0},
		{"parts negative", `,"parts":-1`, fails(protocol.CodeBadFrame), 0, 0},
		{"parts 2049", `,"part":0,"parts":2049`, fails(protocol.CodeBadFrame), 0, 0},
		{"parts huge", `,"parts":9223372036854775807`, fails(protocol.CodeBadFrame), 0, 0},
		{"parts overflows int64", `,"parts":99999999999999999999`, fails(protocol.CodeBadFrame), 0, 0},
		{"part equals parts", `,"part":3,"parts":3`, fails(protocol.CodeBadFrame), 0, 0},
		{"part 1 with default parts", `,"part":1`, fails(protocol.CodeBadFrame), 0, 0},
		{"part negative", `,"part":-1,"parts":3`, fails(protocol.CodeBadFrame), 0, 0},
		{"part 2048 of 2048", `,"part":2048,"parts":2048`, fails(protocol.CodeBadFrame), 0, 0},
		{"parts fractional", `,"parts":1.5`, fails(protocol.CodeBadFrame), 0, 0},
		{"parts as string", `,"parts":"2"`, fails(protocol.CodeBadFrame), 0, 0},
		{"part as bool", `,"part":true`, fails(protocol.CodeBadFrame), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := `{"t":"media","id":"f","kind":"image","data":"YQ=="` + tt.members + `}`
			f := check(t, []byte(msg), tt.want)
			if f == nil {
				return
			}
			m := f.(*protocol.MediaUp)
			if m.Part != tt.part || m.Parts != tt.parts {
				t.Errorf("part/parts = %d/%d, want %d/%d", m.Part, m.Parts, tt.part, tt.parts)
			}
		})
	}
}

func TestDecodeMediaData(t *testing.T) {
	media := func(data any) map[string]any {
		m := map[string]any{"t": "media", "id": "f", "kind": "video", "part": 0, "parts": 2}
		if data != nil {
			m["data"] = data
		}
		return m
	}
	tests := []struct {
		name  string
		frame map[string]any
		want  result
		data  []byte
	}{
		{"small", media("AAEC/w=="), anyFrame, []byte{0, 1, 2, 255}},
		{"exactly 8 MiB", media(b64At8MiB()), anyFrame, b64At8MiBData()},
		{"8 MiB + 1 byte", media(b64Over8MiB()), fails(protocol.CodeTooBig), nil},
		{"missing data", media(nil), fails(protocol.CodeBadFrame), nil},
		{"empty data", media(""), fails(protocol.CodeBadFrame), nil},
		{"invalid base64", media("not base64!"), fails(protocol.CodeBadFrame), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := check(t, marshal(t, tt.frame), tt.want)
			if f != nil && !bytes.Equal(f.(*protocol.MediaUp).Data, tt.data) {
				t.Errorf("data = %d bytes, want %d", len(f.(*protocol.MediaUp).Data), len(tt.data))
			}
		})
	}
}

func TestDecodeMediaMime(t *testing.T) {
	tests := []struct {
		name, mime, filename, want string
	}{
		{"explicit mime kept", "image/heic", "photo.png", "image/heic"},
		{"explicit mime without filename", "application/x-custom", "", "application/x-custom"},
		{"from .png", "", "photo.png", "image/png"},
		{"from upper-case .PDF", "", "REPORT.PDF", "application/pdf"},
		{"from .jpg in a path-like name", "", "dir.v2/cat.jpg", "image/jpeg"},
		{"no filename", "", "", "application/octet-stream"},
		{"no extension", "", "README", "application/octet-stream"},
		{"unknown extension", "", "data.zzqqxx", "application/octet-stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := map[string]any{"t": "media", "id": "f", "kind": "document", "data": "YQ==", "mime": tt.mime}
			if tt.filename != "" {
				m["filename"] = tt.filename
			}
			up := decodeOK(t, marshal(t, m)).(*protocol.MediaUp)
			if up.Mime != tt.want {
				t.Errorf("media mime = %q, want %q", up.Mime, tt.want)
			}
			d := decodeOK(t, marshal(t, map[string]any{"t": "deliver", "media": map[string]any{
				"kind": "document", "data": "YQ==", "mime": tt.mime, "filename": tt.filename,
			}})).(*protocol.Deliver)
			if d.Media.Mime != tt.want {
				t.Errorf("deliver media mime = %q, want %q", d.Media.Mime, tt.want)
			}
		})
	}
}

func TestDecodePrompt(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		want result
	}{
		{"option only", `{"t":"prompt","prompt_id":"p1","option_id":"deny"}`,
			wantFrame(&protocol.PromptAnswer{PromptID: "p1", OptionID: "deny"})},
		{"text only", `{"t":"prompt","prompt_id":"p1","text":"blue"}`,
			wantFrame(&protocol.PromptAnswer{PromptID: "p1", Text: "blue"})},
		{"both", `{"t":"prompt","prompt_id":"p1","option_id":"other","text":"blue"}`,
			wantFrame(&protocol.PromptAnswer{PromptID: "p1", OptionID: "other", Text: "blue"})},
		{"option_id is not validated here", `{"t":"prompt","prompt_id":"p1","option_id":"forged"}`,
			wantFrame(&protocol.PromptAnswer{PromptID: "p1", OptionID: "forged"})},
		{"missing prompt_id", `{"t":"prompt","option_id":"once"}`, fails(protocol.CodeBadFrame)},
		{"empty prompt_id", `{"t":"prompt","prompt_id":"","option_id":"once"}`, fails(protocol.CodeBadFrame)},
		{"neither option nor text", `{"t":"prompt","prompt_id":"p1"}`, fails(protocol.CodeBadFrame)},
		{"both empty", `{"t":"prompt","prompt_id":"p1","option_id":"","text":""}`, fails(protocol.CodeBadFrame)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { check(t, []byte(tt.msg), tt.want) })
	}
}

func TestDecodePingEchoesRawTS(t *testing.T) {
	tests := []struct {
		name string
		ts   string // raw JSON; empty when absent
	}{
		{"absent", ``},
		{"integer", `1712345678901`},
		{"integer beyond float64 precision", `12345678901234567891`},
		{"float with exponent", `1.5e3`},
		{"negative", `-0.25`},
		{"string", `"2024-04-05T10:00:00Z"`},
		{"string with escapes", `"a\"b\\c\u2028"`},
		{"object", `{"sent":1,"seq":[1,2,{"x":null}]}`},
		{"object with spaces", `{ "a" : [ 1 , 2 ] }`},
		{"array", `[1,"two",false]`},
		{"null", `null`},
		{"boolean", `true`},
	}
	// The bound on what the pong echoes: exactly MaxPingTSBytes passes, one
	// byte more is too_big.
	atLimit := `"` + strings.Repeat("x", protocol.MaxPingTSBytes-2) + `"`
	tests = append(tests, struct{ name, ts string }{"at the bound", atLimit})
	decodeErr(t, []byte(`{"t":"ping","ts":"`+strings.Repeat("x", protocol.MaxPingTSBytes-1)+`"}`), protocol.CodeTooBig)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := `{"t":"ping"}`
			if tt.ts != "" {
				msg = `{"t":"ping","ts":` + tt.ts + `}`
			}
			p := decodeOK(t, []byte(msg)).(*protocol.Ping)
			if string(p.TS) != tt.ts {
				t.Errorf("TS = %q, want the raw value %q", p.TS, tt.ts)
			}
			pong := protocol.AppendPong(nil, p.TS)
			want := `{"t":"pong","ts":` + tt.ts + `}`
			if tt.ts == "" {
				want = `{"t":"pong"}`
			}
			if string(pong) != want {
				t.Errorf("AppendPong = %s, want %s", pong, want)
			}
			if !json.Valid(pong) {
				t.Errorf("AppendPong output is not valid JSON: %s", pong)
			}
		})
	}
}

func TestDecodeDeliver(t *testing.T) {
	att := func(kind string, data any) map[string]any {
		m := map[string]any{"kind": kind, "filename": "x.png"}
		if data != nil {
			m["data"] = data
		}
		return m
	}
	tests := []struct {
		name  string
		frame map[string]any
		want  result
	}{
		{"text", map[string]any{"t": "deliver", "id": "d", "target": "tel-2", "text": "hi"},
			wantFrame(&protocol.Deliver{ID: "d", Target: "tel-2", Text: "hi"})},
		{"no target", map[string]any{"t": "deliver", "text": "hi"}, wantFrame(&protocol.Deliver{Text: "hi"})},
		{"media", map[string]any{"t": "deliver", "media": att("image", "YWJj")},
			wantFrame(&protocol.Deliver{Media: &protocol.DeliverMedia{Kind: "image", Mime: "image/png", Filename: "x.png", Data: []byte("abc")}})},
		{"text and media", map[string]any{"t": "deliver", "text": "see", "media": att("animation", "YWJj")},
			wantFrame(&protocol.Deliver{Text: "see", Media: &protocol.DeliverMedia{Kind: "animation", Mime: "image/png", Filename: "x.png", Data: []byte("abc")}})},
		{"neither text nor media", map[string]any{"t": "deliver", "id": "d", "target": "tel-2"}, fails(protocol.CodeBadFrame)},
		{"empty text and null media", map[string]any{"t": "deliver", "text": "", "media": nil}, fails(protocol.CodeBadFrame)},
		{"empty media object", map[string]any{"t": "deliver", "text": "x", "media": map[string]any{}}, fails(protocol.CodeBadFrame)},
		{"media without kind", map[string]any{"t": "deliver", "media": map[string]any{"data": "YWJj"}}, fails(protocol.CodeBadFrame)},
		{"media without data", map[string]any{"t": "deliver", "media": att("image", nil)}, fails(protocol.CodeBadFrame)},
		{"media with invalid base64", map[string]any{"t": "deliver", "media": att("image", "***")}, fails(protocol.CodeBadFrame)},
		{"media kind audio is not media_out", map[string]any{"t": "deliver", "media": att("audio", "YWJj")}, fails(protocol.CodeUnsupportedFrame)},
		{"media kind sticker", map[string]any{"t": "deliver", "media": att("sticker", "YWJj")}, fails(protocol.CodeUnsupportedFrame)},
		{"media exactly 8 MiB", map[string]any{"t": "deliver", "media": att("video", b64At8MiB())}, anyFrame},
		{"media 8 MiB + 1 byte", map[string]any{"t": "deliver", "media": att("video", b64Over8MiB())}, fails(protocol.CodeTooBig)},
		{"wait ack", map[string]any{"t": "deliver", "text": "hi", "wait": "ack"}, wantFrame(&protocol.Deliver{Text: "hi", WaitAck: true})},
		{"wait empty", map[string]any{"t": "deliver", "text": "hi", "wait": ""}, wantFrame(&protocol.Deliver{Text: "hi"})},
		{"wait read", map[string]any{"t": "deliver", "text": "hi", "wait": "read"}, fails(protocol.CodeBadFrame)},
		{"wait not a string", map[string]any{"t": "deliver", "text": "hi", "wait": true}, fails(protocol.CodeBadFrame)},
	}
	for _, kind := range protocol.MediaOut {
		tests = append(tests, struct {
			name  string
			frame map[string]any
			want  result
		}{"media_out kind " + kind, map[string]any{"t": "deliver", "media": att(kind, "YWJj")}, anyFrame})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { check(t, marshal(t, tt.frame), tt.want) })
	}
}

// TestDecodePush: the push frame (the gateway's extension): a kind of fcm
// or apns in any case, a token of printable ASCII up to 4096 bytes, an
// empty or absent one removing; nothing else, and no error quotes the
// token.
func TestDecodePush(t *testing.T) {
	max := strings.Repeat("k", protocol.MaxPushTokenBytes)
	tests := []struct {
		name  string
		frame map[string]any
		want  result
	}{
		{"fcm", map[string]any{"t": "push", "kind": "fcm", "token": "abc:APA91b"}, wantFrame(&protocol.Push{Kind: "fcm", Token: "abc:APA91b"})},
		{"APNS in capitals", map[string]any{"t": "PUSH", "kind": "APNS", "token": "0a1B"}, wantFrame(&protocol.Push{Kind: "apns", Token: "0a1B"})},
		{"no token removes", map[string]any{"t": "push", "kind": "fcm"}, wantFrame(&protocol.Push{Kind: "fcm"})},
		{"token of 4096 bytes", map[string]any{"t": "push", "kind": "fcm", "token": max}, wantFrame(&protocol.Push{Kind: "fcm", Token: max})},
		{"token of 4097 bytes", map[string]any{"t": "push", "kind": "fcm", "token": max + "k"}, fails(protocol.CodeTooBig)},
		{"no kind", map[string]any{"t": "push", "token": "x"}, fails(protocol.CodeBadFrame)},
		{"unknown kind", map[string]any{"t": "push", "kind": "webhook", "token": "x"}, fails(protocol.CodeUnsupportedFrame)},
		{"token with a space", map[string]any{"t": "push", "kind": "fcm", "token": "SECRET x"}, fails(protocol.CodeBadFrame)},
		{"token with LF", map[string]any{"t": "push", "kind": "fcm", "token": "SECRET\nx"}, fails(protocol.CodeBadFrame)},
		{"token past ASCII", map[string]any{"t": "push", "kind": "fcm", "token": "SECRETé"}, fails(protocol.CodeBadFrame)},
		{"token not a string", map[string]any{"t": "push", "kind": "fcm", "token": 5}, fails(protocol.CodeBadFrame)},
		{"kind not a string", map[string]any{"t": "push", "kind": []int{1}}, fails(protocol.CodeBadFrame)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check(t, marshal(t, tt.frame), tt.want)
			if _, err := protocol.Decode(marshal(t, tt.frame)); err != nil && strings.Contains(err.Error(), "SECRET") {
				t.Errorf("the error quotes the token: %v", err)
			}
		})
	}
}

// The returned frame must not alias msg: the caller reuses its read buffer.
func TestDecodeDoesNotAliasInput(t *testing.T) {
	for _, msg := range []string{
		`{"t":"hello","token":"tok","device":{"id":"tel-1","name":"Phone"},"user":{"id":"u","name":"n"}}`,
		`{"t":"text","id":"m1","text":"hello"}`,
		`{"t":"audio","id":"a1","format":"wav","data":"YWJj","text":"abc"}`,
		`{"t":"media","id":"f1","kind":"image","mime":"image/png","filename":"a.png","caption":"c","data":"YWJj"}`,
		`{"t":"prompt","prompt_id":"p","option_id":"once","text":"t"}`,
		`{"t":"ping","ts":{"a":"b"}}`,
		`{"t":"ack","id":"m1"}`,
		`{"t":"deliver","id":"d","target":"x","text":"t","media":{"kind":"image","filename":"a.png","data":"YWJj"}}`,
	} {
		t.Run(msg, func(t *testing.T) {
			buf := []byte(msg)
			got := decodeOK(t, buf)
			for i := range buf {
				buf[i] = '#'
			}
			want := decodeOK(t, []byte(msg))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("frame changed when the input buffer was overwritten:\n got %#v\nwant %#v", got, want)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	tests := []struct {
		s    string
		n    int
		want string
	}{
		{"", 5, ""},
		{"abc", 3, "abc"},
		{"abcd", 3, "abc"},
		{"abc", 0, ""},
		{"яяя", 3, "яяя"},
		{"яяяя", 3, "яяя"},
		{"a😀b", 2, "a😀"},
		{"😀😀", 1, "😀"},
		{"日本語テキスト", 4, "日本語テ"},
	}
	for _, tt := range tests {
		if got := protocol.Truncate(tt.s, tt.n); got != tt.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

// Media kinds are matched case-insensitively, like t and the audio format,
// and the mime type comes from the filename as sent, before truncation.
func TestDecodeMediaKindCaseAndLongFilename(t *testing.T) {
	long := strings.Repeat("n", 300) + ".png"
	f, perr := protocol.Decode([]byte(`{"t":"media","id":"m","kind":"IMAGE","filename":"` + long + `","data":"aGk="}`))
	if perr != nil {
		t.Fatalf("Decode: %v", perr)
	}
	m := f.(*protocol.MediaUp)
	if m.Kind != "image" {
		t.Errorf("kind = %q, want image", m.Kind)
	}
	if m.Mime != "image/png" {
		t.Errorf("mime = %q, want image/png from the untruncated name", m.Mime)
	}
	if n := len([]rune(m.Filename)); n != protocol.MaxFilenameChars {
		t.Errorf("filename has %d characters, want %d", n, protocol.MaxFilenameChars)
	}
	f, perr = protocol.Decode([]byte(`{"t":"deliver","text":"x","media":{"kind":"Voice","filename":"a.ogg","data":"aGk="}}`))
	if perr != nil {
		t.Fatalf("Decode deliver: %v", perr)
	}
	if k := f.(*protocol.Deliver).Media.Kind; k != "voice" {
		t.Errorf("deliver media kind = %q, want voice", k)
	}
}

func TestTypeOf(t *testing.T) {
	for in, want := range map[string]string{
		`{"t":"DELIVER","text":5}`: "deliver",
		`{"t":"text"}`:             "text",
		`{"x":1}`:                  "",
		`{"t":5}`:                  "",
		`not json`:                 "",
	} {
		if got := protocol.TypeOf([]byte(in)); got != want {
			t.Errorf("TypeOf(%s) = %q, want %q", in, got, want)
		}
	}
}

// TestDecodeTruncatedFieldsHoldOnlyTheirBound: a frame keeps what the
// protocol allows of an overlong id or hello field, not the whole string
// it was cut from. 32 frames of each kind with 64 KiB ids held 2 MiB each
// when a cut string shared the decoded one's memory; the test allows
// 512 KiB for all of them.
func TestDecodeTruncatedFieldsHoldOnlyTheirBound(t *testing.T) {
	const frames, size = 32, 64 << 10
	long := strings.Repeat("x", size)
	hello := func(s string) string {
		return `{"t":"hello","token":"tok","device":{"id":` + quote(s) + `,"name":` + quote(s) + `,"platform":` + quote(s) +
			`,"app_version":` + quote(s) + `},"user":{"id":` + quote(s) + `,"name":` + quote(s) + `}}`
	}
	builds := map[string]func(string) string{"hello": hello,
		"option_id": func(s string) string { return `{"t":"prompt","prompt_id":"p","option_id":` + quote(s) + `}` },
		"mime": func(s string) string {
			return `{"t":"media","id":"f","kind":"document","mime":` + quote(s) + `,"filename":"a.pdf","parts":2,"data":"YQ=="}`
		},
	}
	for typ, build := range idFrames {
		builds[typ] = build
	}
	for typ, build := range builds {
		t.Run(typ, func(t *testing.T) {
			heap := func() uint64 {
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				return ms.HeapAlloc
			}
			before := heap()
			kept := make([]protocol.ClientFrame, frames)
			for i := range kept {
				kept[i] = decodeOK(t, []byte(build(long)))
			}
			held := int64(heap()) - int64(before)
			if held > 512<<10 {
				t.Errorf("%d %s frames with %d-byte fields hold %d KiB; want under 512 KiB", frames, typ, size, held>>10)
			}
			runtime.KeepAlive(kept)
		})
	}
}

// TestDecodeUserFieldsTruncated: user.id and user.name are cut at
// MaxUserFieldChars code points, like the device's fields.
func TestDecodeUserFieldsTruncated(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{strings.Repeat("ж", protocol.MaxUserFieldChars), strings.Repeat("ж", protocol.MaxUserFieldChars)},
		{strings.Repeat("ж", protocol.MaxUserFieldChars+1), strings.Repeat("ж", protocol.MaxUserFieldChars)},
	} {
		msg := marshal(t, map[string]any{"t": "hello", "token": "tok", "user": map[string]any{"id": tt.in, "name": tt.in}})
		h := decodeOK(t, msg).(*protocol.Hello)
		if h.User.ID != tt.want || h.User.Name != tt.want {
			t.Errorf("user of %d code points: id %d, name %d code points, want %d", utf8.RuneCountInString(tt.in),
				utf8.RuneCountInString(h.User.ID), utf8.RuneCountInString(h.User.Name), utf8.RuneCountInString(tt.want))
		}
	}
}

// TestDecodeLongMimeIgnored: a mime type longer than any media type is
// replaced by the filename's, as if the app had sent none.
func TestDecodeLongMimeIgnored(t *testing.T) {
	at := "application/" + strings.Repeat("x", protocol.MaxMimeChars-len("application/"))
	for _, tt := range []struct{ mime, want string }{
		{at, at},
		{at + "x", "application/pdf"},
	} {
		m := decodeOK(t, []byte(`{"t":"media","id":"f","kind":"document","mime":`+quote(tt.mime)+`,"filename":"a.pdf","data":"YQ=="}`)).(*protocol.MediaUp)
		d := decodeOK(t, []byte(`{"t":"deliver","id":"d","media":{"kind":"document","mime":`+quote(tt.mime)+`,"filename":"a.pdf","data":"YQ=="}}`)).(*protocol.Deliver)
		if m.Mime != tt.want || d.Media.Mime != tt.want {
			t.Errorf("mime of %d bytes: media %.30q, deliver %.30q; want %.30q", len(tt.mime), m.Mime, d.Media.Mime, tt.want)
		}
	}
}
