package protocol_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// specReady is the ready frame of the specification's handshake section,
// copied verbatim.
const specReady = `{"t":"ready","v":1,"session":"mobile:tel-1","device":{"id":"tel-1","name":"Phone"},"avatar_url":"https://agent.example.com/avatar/","capabilities":{"text":true,"voice":true,"typing":true,"avatar_states":["idle","thinking","speaking"],"media_in":["image","video","document","audio"],"media_out":["image","voice","video","document","animation"],"prompts":["exec_approval","slash_confirm","clarify"],"edit":true,"max_media_bytes":8388608,"max_text_chars":12000}}`

// decodeObject checks that out is exactly one strict JSON object (valid
// UTF-8, no duplicate member names) and returns it as a map.
func decodeObject(t *testing.T, out []byte) map[string]any {
	t.Helper()
	if !jsontext.Value(out).IsValid() {
		t.Fatalf("output is not strict JSON: %s", out)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("output is not a JSON object (%v): %s", err, out)
	}
	return m
}

func parseJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("bad expectation %s: %v", s, err)
	}
	return m
}

func TestAppendFrames(t *testing.T) {
	tests := []struct {
		name string
		enc  func([]byte) []byte
		want string // the expected frame as JSON; compared member by member
	}{
		{"ready as in the spec", func(b []byte) []byte {
			return protocol.AppendReady(b, protocol.Ready{Session: "mobile:tel-1", DeviceID: "tel-1", DeviceName: "Phone", AvatarURL: "https://agent.example.com/avatar/"})
		}, specReady},
		{"ready with empty avatar_url", func(b []byte) []byte {
			return protocol.AppendReady(b, protocol.Ready{Session: protocol.Session("dev-ab"), DeviceID: "dev-ab"})
		}, strings.Replace(strings.Replace(specReady, `"https://agent.example.com/avatar/"`, `""`, 1),
			`"session":"mobile:tel-1","device":{"id":"tel-1","name":"Phone"}`, `"session":"mobile:dev-ab","device":{"id":"dev-ab","name":""}`, 1)},

		{"ready with push kinds", func(b []byte) []byte {
			return protocol.AppendReady(b, protocol.Ready{Session: "mobile:tel-1", DeviceID: "tel-1", DeviceName: "Phone", AvatarURL: "https://agent.example.com/avatar/",
				Push: []string{"fcm", "apns"}})
		}, strings.Replace(specReady, `"max_text_chars":12000}`, `"max_text_chars":12000,"push":["fcm","apns"]}`, 1)},
		{"push registered", func(b []byte) []byte { return protocol.AppendPush(b, "fcm", true) }, `{"t":"push","kind":"fcm","registered":true}`},
		{"push removed", func(b []byte) []byte { return protocol.AppendPush(b, "apns", false) }, `{"t":"push","kind":"apns","registered":false}`},

		{"message first chunk", func(b []byte) []byte {
			return protocol.AppendMessage(b, protocol.Message{ID: "r1", Text: "Hello", Index: 0, Total: 2})
		}, `{"t":"message","id":"r1","text":"Hello","chunk":{"index":0,"total":2},"final":false}`},
		{"message last chunk", func(b []byte) []byte {
			return protocol.AppendMessage(b, protocol.Message{ID: "r1", Text: " world", Index: 1, Total: 2, Final: true})
		}, `{"t":"message","id":"r1","text":" world","chunk":{"index":1,"total":2},"final":true}`},
		{"message edit", func(b []byte) []byte {
			return protocol.AppendMessage(b, protocol.Message{ID: "r1", Text: "Hel", Index: 0, Total: 1, Edit: true})
		}, `{"t":"message","id":"r1","text":"Hel","chunk":{"index":0,"total":1},"final":false,"edit":true}`},
		{"message with escapes", func(b []byte) []byte {
			return protocol.AppendMessage(b, protocol.Message{ID: "r\"2", Text: "line1\nline2\t\"q\" \\ \u2028 </script>", Index: 0, Total: 1, Final: true})
		}, `{"t":"message","id":"r\"2","text":"line1\nline2\t\"q\" \\ \u2028 </script>","chunk":{"index":0,"total":1},"final":true}`},

		{"media with every field", func(b []byte) []byte {
			return protocol.AppendMedia(b, protocol.MediaChunk{ID: "f1", Kind: "image", Mime: "image/png", Filename: "a.png",
				Caption: "cat", Part: 1, Parts: 3, Final: false, Size: 9000000, Data: []byte{0, 1, 2, 0xfb, 0xff},
				URL: "https://x.example/f1", ReplyTo: "m7"})
		}, `{"t":"media","id":"f1","kind":"image","mime":"image/png","filename":"a.png","caption":"cat","part":1,"parts":3,"final":false,"size":9000000,"data":"AAEC+/8=","url":"https://x.example/f1","reply_to":"m7"}`},
		{"media optional fields omitted", func(b []byte) []byte {
			return protocol.AppendMedia(b, protocol.MediaChunk{ID: "f2", Kind: "voice", Mime: "audio/ogg", Filename: "v.ogg",
				Part: 0, Parts: 1, Final: true, Size: 3, Data: []byte("abc")})
		}, `{"t":"media","id":"f2","kind":"voice","mime":"audio/ogg","filename":"v.ogg","part":0,"parts":1,"final":true,"size":3,"data":"YWJj"}`},
		{"media by link without data", func(b []byte) []byte {
			return protocol.AppendMedia(b, protocol.MediaChunk{ID: "f3", Kind: "video", Mime: "video/mp4", Filename: "",
				Parts: 1, Final: true, Size: 1 << 30, URL: "https://x.example/big.mp4"})
		}, `{"t":"media","id":"f3","kind":"video","mime":"video/mp4","filename":"","part":0,"parts":1,"final":true,"size":1073741824,"url":"https://x.example/big.mp4"}`},

		{"prompt exec_approval", func(b []byte) []byte {
			return protocol.AppendPrompt(b, protocol.Prompt{ID: "p1", Kind: protocol.PromptExecApproval, Text: "Run a command?",
				Options: protocol.PromptOptions(protocol.PromptExecApproval, nil), Command: "rm -rf ./build",
				Description: "deletes the build dir", Session: "mobile:tel-1", TimeoutSeconds: 300})
		}, `{"t":"prompt","id":"p1","kind":"exec_approval","text":"Run a command?","options":[` +
			`{"id":"once","label":"Allow once","style":"primary"},{"id":"session","label":"Allow for this session","style":""},` +
			`{"id":"always","label":"Always allow","style":""},{"id":"deny","label":"Deny","style":"danger"}],` +
			`"command":"rm -rf ./build","description":"deletes the build dir","session":"mobile:tel-1","timeout_seconds":300}`},
		{"prompt clarify without command", func(b []byte) []byte {
			return protocol.AppendPrompt(b, protocol.Prompt{ID: "p2", Kind: protocol.PromptClarify, Text: "Which colour?",
				Options: protocol.PromptOptions(protocol.PromptClarify, []string{"red", "blue"}), Session: "mobile:tel-1", TimeoutSeconds: 60})
		}, `{"t":"prompt","id":"p2","kind":"clarify","text":"Which colour?","options":[` +
			`{"id":"c0","label":"red","style":""},{"id":"c1","label":"blue","style":""},{"id":"other","label":"Other…","style":""}],` +
			`"session":"mobile:tel-1","timeout_seconds":60}`},
		{"prompt without options has an empty array", func(b []byte) []byte {
			return protocol.AppendPrompt(b, protocol.Prompt{ID: "p3", Kind: "clarify", Text: "?", Session: "s", TimeoutSeconds: 1})
		}, `{"t":"prompt","id":"p3","kind":"clarify","text":"?","options":[],"session":"s","timeout_seconds":1}`},

		{"prompt_done bare", func(b []byte) []byte {
			return protocol.AppendPromptDone(b, protocol.PromptDone{ID: "p1"})
		}, `{"t":"prompt_done","id":"p1"}`},
		{"prompt_done applied option", func(b []byte) []byte {
			return protocol.AppendPromptDone(b, protocol.PromptDone{ID: "p1", OptionID: "deny"})
		}, `{"t":"prompt_done","id":"p1","option_id":"deny"}`},
		{"prompt_done expired", func(b []byte) []byte {
			return protocol.AppendPromptDone(b, protocol.PromptDone{ID: "p1", OptionID: "deny", Expired: true})
		}, `{"t":"prompt_done","id":"p1","option_id":"deny","expired":true}`},

		{"avatar idle", func(b []byte) []byte { return protocol.AppendAvatar(b, "idle") }, `{"t":"avatar","state":"idle"}`},
		{"avatar thinking", func(b []byte) []byte { return protocol.AppendAvatar(b, "thinking") }, `{"t":"avatar","state":"thinking"}`},
		{"avatar speaking", func(b []byte) []byte { return protocol.AppendAvatar(b, "speaking") }, `{"t":"avatar","state":"speaking"}`},
		{"avatar unknown state", func(b []byte) []byte { return protocol.AppendAvatar(b, "angry") }, `{"t":"avatar","state":"idle"}`},
		{"avatar empty state", func(b []byte) []byte { return protocol.AppendAvatar(b, "") }, `{"t":"avatar","state":"idle"}`},
		{"avatar state is case-sensitive", func(b []byte) []byte { return protocol.AppendAvatar(b, "Thinking") }, `{"t":"avatar","state":"idle"}`},
		{"avatar state with a quote", func(b []byte) []byte { return protocol.AppendAvatar(b, `x","mood":"sad`) }, `{"t":"avatar","state":"idle"}`},

		{"typing", func(b []byte) []byte { return protocol.AppendTyping(b, false) }, `{"t":"typing"}`},
		{"typing stop", func(b []byte) []byte { return protocol.AppendTyping(b, true) }, `{"t":"typing","stop":true}`},

		{"pong without ts", func(b []byte) []byte { return protocol.AppendPong(b, nil) }, `{"t":"pong"}`},
		{"pong with ts", func(b []byte) []byte { return protocol.AppendPong(b, []byte(`{"n":1}`)) }, `{"t":"pong","ts":{"n":1}}`},

		{"error", func(b []byte) []byte {
			return protocol.AppendError(b, protocol.NewError(protocol.CodeTooBig, "text is longer than 12000 characters"))
		}, `{"t":"error","code":"too_big","message":"text is longer than 12000 characters","fatal":false}`},
		{"error fatal", func(b []byte) []byte {
			return protocol.AppendError(b, protocol.NewFatal(protocol.CodeAuthFailed, `bad "token"`))
		}, `{"t":"error","code":"auth_failed","message":"bad \"token\"","fatal":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decodeObject(t, tt.enc(nil))
			if want := parseJSON(t, tt.want); !reflect.DeepEqual(got, want) {
				gotJSON, _ := json.Marshal(got)
				wantJSON, _ := json.Marshal(want)
				t.Errorf("frame differs\n got %s\nwant %s", gotJSON, wantJSON)
			}

			// Append semantics: the prefix is kept, the frame is the same.
			prefix := []byte("prefix\x00")
			buf := make([]byte, len(prefix), 4096)
			copy(buf, prefix)
			out := tt.enc(buf)
			if !bytes.HasPrefix(out, prefix) {
				t.Fatalf("Append did not keep the buffer's contents: %q", out)
			}
			if !bytes.Equal(out[len(prefix):], tt.enc(nil)) {
				t.Errorf("appending to a non-empty buffer gave a different frame")
			}
		})
	}
}

// The t member comes first, so a client can dispatch on a prefix.
func TestAppendFramesStartWithType(t *testing.T) {
	frames := map[string][]byte{
		"ready":       protocol.AppendReady(nil, protocol.Ready{}),
		"message":     protocol.AppendMessage(nil, protocol.Message{}),
		"media":       protocol.AppendMedia(nil, protocol.MediaChunk{}),
		"prompt":      protocol.AppendPrompt(nil, protocol.Prompt{}),
		"prompt_done": protocol.AppendPromptDone(nil, protocol.PromptDone{}),
		"avatar":      protocol.AppendAvatar(nil, ""),
		"typing":      protocol.AppendTyping(nil, false),
		"pong":        protocol.AppendPong(nil, nil),
		"error":       protocol.AppendError(nil, &protocol.Error{}),
		"push":        protocol.AppendPush(nil, "fcm", true),
	}
	for typ, out := range frames {
		if want := `{"t":"` + typ + `"`; !bytes.HasPrefix(out, []byte(want)) {
			t.Errorf("%s frame starts %.20q, want %q", typ, out, want)
		}
		decodeObject(t, out)
	}
}

func TestAppendMediaDataRoundTrips(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 255, 256, 4096, 3 << 20} {
		data := payload(n)
		out := protocol.AppendMedia(nil, protocol.MediaChunk{ID: "f", Kind: "document", Mime: "application/pdf", Filename: "a.pdf", Parts: 1, Final: true, Size: n, Data: data})
		var m struct {
			Data []byte `json:"data"` // encoding/json decodes base64 into []byte
			Size int    `json:"size"`
		}
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(m.Data, data) || m.Size != n {
			t.Errorf("%d bytes: data round-trips to %d bytes, size %d", n, len(m.Data), m.Size)
		}
	}
}

// MediaFrameSize is used to size buffers; it must never be below the real size.
func TestMediaFrameSizeIsAnUpperBound(t *testing.T) {
	// Every byte of worst is written as a 6-byte escape.
	worst := strings.Repeat("\x01", 50) + "\xff\xfe"
	tests := []protocol.MediaChunk{
		{},
		{ID: "f", Kind: "image", Mime: "image/png", Filename: "a.png", Parts: 1, Final: true, Size: 3, Data: []byte("abc")},
		{ID: worst, Kind: worst, Mime: worst, Filename: worst, Caption: worst, URL: worst, ReplyTo: worst,
			Part: -1 << 63, Parts: -1 << 63, Size: -1 << 63, Data: payload(1000)},
		{ID: "x", Kind: "video", Mime: "video/mp4", Filename: "v.mp4", Caption: "c", URL: "u", ReplyTo: "r",
			Part: 1<<63 - 1, Parts: 1<<63 - 1, Size: 1<<63 - 1, Final: false, Data: payload(3 << 20)},
	}
	for i, m := range tests {
		out := protocol.AppendMedia(nil, m)
		if bound := protocol.MediaFrameSize(m); len(out) > bound {
			t.Errorf("case %d: frame is %d bytes, MediaFrameSize says at most %d", i, len(out), bound)
		}
	}
}

// asJSON is what encoding/json makes of s after a round trip: s itself when
// it is valid UTF-8, otherwise s with each invalid byte replaced by U+FFFD.
func asJSON(t testing.TB, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("json.Marshal(%q): %v", s, err)
	}
	var back string
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("json.Unmarshal(%s): %v", b, err)
	}
	return back
}

// checkAppendString asserts every property of AppendString(s): valid JSON,
// the same string as encoding/json makes of s (s itself for valid UTF-8), no
// raw control characters, no raw U+2028/U+2029, and valid UTF-8 output.
func checkAppendString(t testing.TB, s string) {
	t.Helper()
	out := protocol.AppendString(nil, s)
	if !json.Valid(out) {
		t.Fatalf("AppendString(%q) = %s: not valid JSON", s, out)
	}
	if !utf8.Valid(out) {
		t.Fatalf("AppendString(%q) = %q: not valid UTF-8", s, out)
	}
	var back string
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatalf("AppendString(%q) = %s: %v", s, out, err)
	}
	if want := asJSON(t, s); back != want {
		t.Fatalf("AppendString(%q) decodes to %q, encoding/json gives %q", s, back, want)
	}
	if utf8.ValidString(s) && back != s {
		t.Fatalf("AppendString(%q) decodes to %q", s, back)
	}
	for _, c := range out {
		if c < 0x20 {
			t.Fatalf("AppendString(%q) = %q: raw control character %#x", s, out, c)
		}
	}
	if bytes.ContainsRune(out, '\u2028') || bytes.ContainsRune(out, '\u2029') {
		t.Fatalf("AppendString(%q) = %q: raw U+2028/U+2029", s, out)
	}
}

func TestAppendString(t *testing.T) {
	tests := []struct {
		in, want string // want is the exact output
	}{
		{"", `""`},
		{"plain", `"plain"`},
		{`quote " and backslash \`, `"quote \" and backslash \\"`},
		{"\n\r\t", `"\n\r\t"`},
		{"\x00\x01\x08\x0c\x1f", `"\u0000\u0001\u0008\u000c\u001f"`},
		{"\x7f", "\"\x7f\""},
		{"</script>&", `"</script>&"`},
		{"Привет, 世界 😀", `"Привет, 世界 😀"`},
		{"a\u2028b\u2029c", `"a\u2028b\u2029c"`},
		{"\ufffd", "\"\ufffd\""},
		{"\xff", `"\ufffd"`},
		{"a\xc3", `"a\ufffd"`},
		{"\xe2\x82", `"\ufffd\ufffd"`},
		{"\xed\xa0\x80", `"\ufffd\ufffd\ufffd"`}, // UTF-8 encoded surrogate
		{"\xf4\x90\x80\x80", `"\ufffd\ufffd\ufffd\ufffd"`},
		{"ok\xffok", `"ok\ufffdok"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := string(protocol.AppendString(nil, tt.in)); got != tt.want {
				t.Errorf("AppendString(%q) = %s, want %s", tt.in, got, tt.want)
			}
			checkAppendString(t, tt.in)
			if got := string(protocol.AppendString([]byte("x:"), tt.in)); got != "x:"+tt.want {
				t.Errorf("AppendString with prefix = %s, want x:%s", got, tt.want)
			}
		})
	}
}

// Every byte value alone and every code point, in batches, against encoding/json.
func TestAppendStringAllCodePoints(t *testing.T) {
	for c := 0; c < 256; c++ {
		checkAppendString(t, string([]byte{byte(c)}))
		checkAppendString(t, "a"+string([]byte{byte(c)})+"\u00e9")
	}
	var b strings.Builder
	for r := rune(0); r <= utf8.MaxRune; r++ {
		b.WriteRune(r) // surrogates become U+FFFD
		if b.Len() > 1<<16 || r == utf8.MaxRune {
			checkAppendString(t, b.String())
			b.Reset()
		}
	}
}

func TestSplitText(t *testing.T) {
	tests := []struct {
		name  string
		text  string
		limit int
		want  []int // code points per piece
	}{
		{"empty is one empty piece", "", 3500, []int{0}},
		{"short", "hello", 3500, []int{5}},
		{"3500 ASCII is one piece", strings.Repeat("a", 3500), 3500, []int{3500}},
		{"3501 ASCII is two pieces", strings.Repeat("a", 3501), 3500, []int{3500, 1}},
		{"3500 Cyrillic is one piece", strings.Repeat("я", 3500), 3500, []int{3500}},
		{"3501 Cyrillic is two pieces", strings.Repeat("я", 3501), 3500, []int{3500, 1}},
		{"7000 emoji", strings.Repeat("😀", 7000), 3500, []int{3500, 3500}},
		{"7001 mixed", strings.Repeat("a😀я", 2333) + "zz", 3500, []int{3500, 3500, 1}},
		{"limit 0 means 3500", strings.Repeat("ж", 3501), 0, []int{3500, 1}},
		{"negative limit means 3500", strings.Repeat("ж", 3500), -1, []int{3500}},
		{"limit 1", "aбв😀", 1, []int{1, 1, 1, 1}},
		{"limit 2 odd length", "aбв😀z", 2, []int{2, 2, 1}},
		{"12000 chars at the default limit", strings.Repeat("€", 12000), protocol.DefaultChunkLimit, []int{3500, 3500, 3500, 1500}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pieces := protocol.SplitText(tt.text, tt.limit)
			var got []int
			for _, p := range pieces {
				got = append(got, utf8.RuneCountInString(p))
				if !utf8.ValidString(p) {
					t.Errorf("piece %q splits a rune", p)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("piece lengths = %v, want %v", got, tt.want)
			}
			if joined := strings.Join(pieces, ""); joined != tt.text {
				t.Errorf("pieces do not concatenate to the input")
			}
		})
	}
}
