package agent_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/fakellm"
	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// call is one call of the agent on its Output.
type call struct {
	op          string // message, typing, typing:stop
	id, text    string
	edit, final bool
	at          time.Time
}

// recOutput is an agent.Output that records the calls and serves blobs.
type recOutput struct {
	mu    sync.Mutex
	calls []call
	blobs map[string][]byte
}

func (o *recOutput) add(c call) error {
	c.at = time.Now()
	o.mu.Lock()
	o.calls = append(o.calls, c)
	o.mu.Unlock()
	return nil
}

func (o *recOutput) Message(ctx context.Context, id, text string, edit, final bool) error {
	return o.add(call{op: "message", id: id, text: text, edit: edit, final: final})
}
func (o *recOutput) Media(context.Context, agent.Media) error { return o.add(call{op: "media"}) }
func (o *recOutput) Prompt(context.Context, agent.Prompt) (string, error) {
	return "", o.add(call{op: "prompt"})
}
func (o *recOutput) Typing(ctx context.Context, stop bool) error {
	if stop {
		return o.add(call{op: "typing:stop"})
	}
	return o.add(call{op: "typing"})
}
func (o *recOutput) Avatar(ctx context.Context, state string) error {
	return o.add(call{op: "avatar:" + state})
}
func (o *recOutput) Blob(ctx context.Context, key string) ([]byte, error) {
	if b, ok := o.blobs[key]; ok {
		return b, nil
	}
	return nil, store.ErrNotFound
}

func (o *recOutput) Calls() []call {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]call(nil), o.calls...)
}

// messages returns the message calls.
func messages(cs []call) []call {
	var out []call
	for _, c := range cs {
		if c.op == "message" {
			out = append(out, c)
		}
	}
	return out
}

// newOpenAI returns an agent on f with small bounds; mutate adjusts them.
func newOpenAI(t *testing.T, f *fakellm.Server, h store.History, mutate func(*agent.OpenAIConfig)) *agent.OpenAI {
	t.Helper()
	cfg := agent.OpenAIConfig{
		BaseURL: f.URL + "/v1", APIKey: "sk-test", Model: "test-model", SystemPrompt: "You are a test.",
		EditEvery: 100 * time.Millisecond, Timeout: 5 * time.Second, FirstByte: 2 * time.Second,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := agent.NewOpenAI(cfg, h)
	if err != nil {
		t.Fatalf("NewOpenAI: %v", err)
	}
	return a
}

func textEvent(session, id, text string) wire.Event {
	return wire.Event{Kind: wire.EventText, Session: session, Device: strings.TrimPrefix(session, "mobile:"), ID: id, Text: text}
}

// TestOpenAIStreams: the request carries the model, stream:true, the key and
// the system prompt; the device gets typing, the first delta as a message,
// edits at most every EditEvery with the whole text so far, a final edit with
// the whole answer and typing stop.
func TestOpenAIStreams(t *testing.T) {
	deltas := make([]string, 20)
	for i := range deltas {
		deltas[i] = fmt.Sprintf("w%d ", i)
	}
	want := strings.Join(deltas, "")
	f := fakellm.New(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		fakellm.Stream(w, r, 15*time.Millisecond, deltas...)
	})
	const every = 100 * time.Millisecond
	a := newOpenAI(t, f, newMemstore(t), func(c *agent.OpenAIConfig) { c.EditEvery = every })
	out := &recOutput{}
	if err := a.Handle(t.Context(), textEvent("mobile:tel-1", "m-1", "hello there"), out); err != nil {
		t.Fatalf("Handle: %v", err)
	}

	reqs := f.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Path != "/v1/chat/completions" || r.Auth != "Bearer sk-test" || r.Accept != "text/event-stream" {
		t.Errorf("request path %q, Authorization %q, Accept %q", r.Path, r.Auth, r.Accept)
	}
	if r.Body.Model != "test-model" || !r.Body.Stream {
		t.Errorf("request model %q stream %v, want test-model and true", r.Body.Model, r.Body.Stream)
	}
	if r.Roles() != "system,user" || r.Text(0) != "You are a test." || r.Text(1) != "hello there" {
		t.Errorf("request messages %s: %q, %q", r.Roles(), r.Text(0), r.Text(1))
	}

	calls := out.Calls()
	if calls[0].op != "typing" {
		t.Errorf("first call %+v, want typing", calls[0])
	}
	last := calls[len(calls)-1]
	if last.op != "typing:stop" {
		t.Errorf("last call %+v, want typing:stop", last)
	}
	msgs := messages(calls)
	if len(msgs) < 3 {
		t.Fatalf("%d message calls, want a first message, edits and a final edit: %+v", len(msgs), msgs)
	}
	if m := msgs[0]; m.edit || m.final || m.text != deltas[0] {
		t.Errorf("first message %+v, want the first delta %q, neither edit nor final", m, deltas[0])
	}
	fin := msgs[len(msgs)-1]
	if !fin.edit || !fin.final || fin.text != want {
		t.Errorf("final message %+v, want an edit with %q", fin, want)
	}
	for i, m := range msgs {
		if m.id != msgs[0].id {
			t.Errorf("message %d has id %q, want %q", i, m.id, msgs[0].id)
		}
		if i > 0 && i < len(msgs)-1 {
			if !m.edit || m.final || !strings.HasPrefix(want, m.text) {
				t.Errorf("edit %d %+v: want a non-final edit with a prefix of the answer", i, m)
			}
			if gap := m.at.Sub(msgs[i-1].at); gap < every*9/10 {
				t.Errorf("edit %d came %v after the message before it, want at least %v", i, gap, every)
			}
		}
	}
	// 20 deltas over about 300 ms: coalesced into a few edits, not 19.
	if n := len(msgs) - 2; n > 6 {
		t.Errorf("%d edits for 20 deltas in about 300 ms with EditEvery %v", n, every)
	}
}

// TestOpenAIHistory: the second turn sends the first turn's question and
// answer; the history is per session and bounded.
func TestOpenAIHistory(t *testing.T) {
	f := fakellm.New(t, func(w http.ResponseWriter, r *http.Request, n int) {
		fakellm.Stream(w, r, 0, fmt.Sprintf("answer %d", n))
	})
	s := newMemstore(t)
	a := newOpenAI(t, f, s, func(c *agent.OpenAIConfig) { c.HistoryLen = 4 })
	for i, q := range []string{"q0", "q1", "q2"} {
		if err := a.Handle(t.Context(), textEvent("mobile:tel-1", fmt.Sprint(i), q), &recOutput{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Handle(t.Context(), textEvent("mobile:tel-2", "x", "other"), &recOutput{}); err != nil {
		t.Fatal(err)
	}
	reqs := f.Requests()
	if r := reqs[1]; r.Roles() != "system,user,assistant,user" || r.Text(1) != "q0" || r.Text(2) != "answer 0" || r.Text(3) != "q1" {
		t.Errorf("second turn sent %s: %q %q %q", r.Roles(), r.Text(1), r.Text(2), r.Text(3))
	}
	// HistoryLen 4: the third turn sees the two turns before it.
	if r := reqs[2]; r.Roles() != "system,user,assistant,user,assistant,user" || r.Text(1) != "q0" || r.Text(5) != "q2" {
		t.Errorf("third turn sent %s", r.Roles())
	}
	// Another session starts afresh.
	if r := reqs[3]; r.Roles() != "system,user" {
		t.Errorf("another session sent %s, want no history", r.Roles())
	}
	items, err := s.History(t.Context(), "mobile:tel-1")
	if err != nil || len(items) != 4 || !strings.Contains(string(items[0]), "q1") {
		t.Errorf("history after three turns with HistoryLen 4: %q, %v; want the last two turns", items, err)
	}
}

// TestOpenAIHistoryAcrossNodes: two agents on two Redis stores with one
// prefix, as on two router nodes: the second continues the conversation the
// first began.
func TestOpenAIHistoryAcrossNodes(t *testing.T) {
	url := testsvc.RedisURL(t)
	prefix := fmt.Sprintf("hermes-test:openai:%d:", time.Now().UnixNano())
	open := func() *redisstore.Store {
		s, err := redisstore.New(t.Context(), redisstore.Options{URL: url, Prefix: prefix})
		if err != nil {
			t.Fatalf("redisstore: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	f := fakellm.New(t, func(w http.ResponseWriter, r *http.Request, n int) {
		fakellm.Stream(w, r, 0, "Paris", " it is.")
	})
	a1, a2 := newOpenAI(t, f, open(), nil), newOpenAI(t, f, open(), nil)
	if err := a1.Handle(t.Context(), textEvent("mobile:tel-x", "1", "capital of France?"), &recOutput{}); err != nil {
		t.Fatal(err)
	}
	if err := a2.Handle(t.Context(), textEvent("mobile:tel-x", "2", "are you sure?"), &recOutput{}); err != nil {
		t.Fatal(err)
	}
	r := f.Requests()[1]
	if r.Roles() != "system,user,assistant,user" || r.Text(1) != "capital of France?" || r.Text(2) != "Paris it is." {
		t.Fatalf("the second node sent %s: %q %q; want the first node's turn", r.Roles(), r.Text(1), r.Text(2))
	}
}

// TestOpenAIImage: an image goes as a data URL content part with its caption;
// the history keeps a note in words. An image over MaxImage goes as a note;
// one of exactly MaxImage bytes goes whole.
func TestOpenAIImage(t *testing.T) {
	f := fakellm.New(t, func(w http.ResponseWriter, r *http.Request, _ int) { fakellm.Stream(w, r, 0, "a cat") })
	const maxImage = 1000
	s := newMemstore(t)
	a := newOpenAI(t, f, s, func(c *agent.OpenAIConfig) { c.MaxImage = maxImage })
	png := append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, maxImage-8)...)
	out := &recOutput{blobs: map[string][]byte{"k-ok": png, "k-big": append(png, 0)}}
	img := func(blob string, size int) wire.Event {
		return wire.Event{Kind: wire.EventMedia, Session: "mobile:tel-1", Device: "tel-1", ID: blob,
			Media: &wire.MediaRef{Kind: "image", Mime: "image/png", Filename: "cat.png", Caption: "what is this?", Size: size, Blob: blob}}
	}
	if err := a.Handle(t.Context(), img("k-ok", maxImage), out); err != nil {
		t.Fatal(err)
	}
	if err := a.Handle(t.Context(), img("k-big", maxImage+1), out); err != nil {
		t.Fatal(err)
	}
	reqs := f.Requests()
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL struct {
			URL string `json:"url"`
		} `json:"image_url"`
	}
	if err := json.Unmarshal(reqs[0].Body.Messages[1].Content, &parts); err != nil {
		t.Fatalf("the image message's content is not a list of parts: %v: %s", err, reqs[0].Body.Messages[1].Content)
	}
	wantURL := "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)
	if len(parts) != 2 || parts[0].Type != "text" || parts[0].Text != "what is this?" ||
		parts[1].Type != "image_url" || parts[1].ImageURL.URL != wantURL {
		t.Fatalf("image parts = %+v", parts)
	}
	// The second request: history holds the first image as words, and the
	// oversized one is a note.
	r := reqs[1]
	if r.Roles() != "system,user,assistant,user" {
		t.Fatalf("second request %s", r.Roles())
	}
	if h := r.Text(1); !strings.Contains(h, "image") || !strings.Contains(h, "what is this?") || strings.Contains(h, "base64") {
		t.Errorf("history keeps the image as %q, want a note with its caption", h)
	}
	if n := r.Text(3); !strings.Contains(n, "too large") || !strings.Contains(n, "what is this?") {
		t.Errorf("an image over MaxImage went as %q, want a note", n)
	}
}

// TestOpenAIAudioAndFiles: audio goes as its recognised text, or a note
// without one; other files as a note with the caption.
func TestOpenAIAudioAndFiles(t *testing.T) {
	f := fakellm.New(t, func(w http.ResponseWriter, r *http.Request, _ int) { fakellm.Stream(w, r, 0, "ok") })
	a := newOpenAI(t, f, newMemstore(t), nil)
	evs := []wire.Event{
		{Kind: wire.EventAudio, Session: "mobile:a", Device: "a", ID: "1", Format: "ogg", Text: "turn on the lights", Media: &wire.MediaRef{Kind: "audio", Size: 500, Blob: "x"}},
		{Kind: wire.EventAudio, Session: "mobile:b", Device: "b", ID: "2", Format: "wav", Media: &wire.MediaRef{Kind: "audio", Size: 700, Blob: "x"}},
		{Kind: wire.EventMedia, Session: "mobile:c", Device: "c", ID: "3", Media: &wire.MediaRef{Kind: "document", Mime: "application/pdf", Filename: "report.pdf", Caption: "summarise", Size: 1234, Blob: "x"}},
	}
	for _, ev := range evs {
		if err := a.Handle(t.Context(), ev, &recOutput{}); err != nil {
			t.Fatal(err)
		}
	}
	reqs := f.Requests()
	if got := reqs[0].Text(1); got != "turn on the lights" {
		t.Errorf("audio with recognised text went as %q", got)
	}
	if got := reqs[1].Text(1); !strings.Contains(got, "voice message") || !strings.Contains(got, "700 bytes") {
		t.Errorf("audio without text went as %q", got)
	}
	if got := reqs[2].Text(1); !strings.Contains(got, "report.pdf") || !strings.Contains(got, "application/pdf") || !strings.Contains(got, "summarise") {
		t.Errorf("a document went as %q", got)
	}
}

// TestOpenAIFailures: each way the upstream can fail ends in a final message
// saying why and typing stop, and records no turn.
func TestOpenAIFailures(t *testing.T) {
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	for _, tc := range []struct {
		name    string
		reply   func(w http.ResponseWriter, r *http.Request)
		mutate  func(*agent.OpenAIConfig)
		started bool   // a first part was sent before the failure
		want    string // in the final text
		result  string // of the call in hermes_agent_upstream_requests_total
	}{
		{"status 500", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(500)
			io.WriteString(w, `{"error":{"message":"model exploded","type":"server_error"}}`)
		}, nil, false, "The agent could not answer: upstream returned 500 Internal Server Error: model exploded.", "status"},
		{"status 502 plain", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}, nil, false, "upstream returned 502 Bad Gateway: bad gateway", "status"},
		{"nothing within FirstByte", func(w http.ResponseWriter, r *http.Request) { hang(w, r) },
			func(c *agent.OpenAIConfig) { c.FirstByte = 300 * time.Millisecond }, false, "upstream sent nothing within 300ms", "timeout"},
		{"headers then silence", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.(http.Flusher).Flush()
			hang(w, r)
		}, func(c *agent.OpenAIConfig) { c.FirstByte = 300 * time.Millisecond }, false, "upstream sent nothing within 300ms", "timeout"},
		{"hangs past Timeout", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Half an\"}}]}\n\n")
			w.(http.Flusher).Flush()
			hang(w, r)
		}, func(c *agent.OpenAIConfig) { c.Timeout = 500 * time.Millisecond }, true,
			"Half an\n\n[The agent could not finish: upstream did not finish the answer within 500ms.]", "timeout"},
		{"malformed", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: {not json\n\n")
		}, nil, true, "upstream sent a malformed stream", "stream"},
		{"error event", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "data: {\"error\":{\"message\":\"rate limited\"}}\n\n")
		}, nil, false, "The agent could not answer: upstream failed: rate limited.", "stream"},
		{"ends early", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"trunc\"}}]}\n\n")
		}, nil, true, "ended before the answer was complete", "stream"},
		{"line too long", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, ": "+strings.Repeat("x", 255)+"\n\n")
		}, func(c *agent.OpenAIConfig) { c.MaxLine = 256 }, false, "upstream sent a line longer than 256 bytes", "stream"},
		{"unreachable", nil, func(c *agent.OpenAIConfig) { c.BaseURL = "http://127.0.0.1:1/v1" }, false, "cannot reach upstream", "unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := fakellm.New(t, func(w http.ResponseWriter, r *http.Request, _ int) { tc.reply(w, r) })
			s := newMemstore(t)
			tel := newTelemetry(t)
			a := newOpenAI(t, f, s, func(c *agent.OpenAIConfig) {
				c.Meter = tel.Meter()
				if tc.mutate != nil {
					tc.mutate(c)
				}
			})
			out := &recOutput{}
			start := time.Now()
			if err := a.Handle(t.Context(), textEvent("mobile:tel-1", "m", "hi"), out); err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if d := time.Since(start); d > testsvc.Slack(3*time.Second) {
				t.Errorf("the failure took %v to report", d)
			}
			calls := out.Calls()
			if len(calls) < 2 || calls[len(calls)-1].op != "typing:stop" {
				t.Fatalf("calls %+v, want typing:stop last", calls)
			}
			fin := calls[len(calls)-2]
			if fin.op != "message" || !fin.final || !strings.Contains(fin.text, tc.want) {
				t.Fatalf("final message %+v, want one containing %q", fin, tc.want)
			}
			msgs := messages(calls)
			if fin.edit != tc.started || fin.id != msgs[0].id {
				t.Errorf("final message edit=%v id %q, want edit=%v of the message %q", fin.edit, fin.id, tc.started, msgs[0].id)
			}
			if items, _ := s.History(t.Context(), "mobile:tel-1"); len(items) != 0 {
				t.Errorf("a failed turn left history %q", items)
			}
			m := samples(t, tel)
			for _, result := range upstreamResults {
				want := 0.0
				if result == tc.result {
					want = 1
				}
				if got := m[upstreamRequests(result)]; got != want {
					t.Errorf("%s = %v, want %v", upstreamRequests(result), got, want)
				}
			}
			if m["hermes_agent_upstream_duration_seconds_count"] != 1 {
				t.Errorf("hermes_agent_upstream_duration_seconds_count = %v, want 1", m["hermes_agent_upstream_duration_seconds_count"])
			}
		})
	}
}

// upstreamResults are the result label's values.
var upstreamResults = []string{"ok", "status", "unreachable", "timeout", "stream", "canceled"}

func upstreamRequests(result string) string {
	return `hermes_agent_upstream_requests_total{result="` + result + `"}`
}

// TestOpenAIMetrics: every result of hermes_agent_upstream_requests_total
// is at 0 from the agent's start; an answer counts as ok with its duration
// and time to the first byte; a call the router ends (its context
// canceled) counts as canceled.
func TestOpenAIMetrics(t *testing.T) {
	gate := make(chan struct{})
	f := fakellm.New(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 0 {
			fakellm.Stream(w, r, 0, "Hello", " there")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		close(gate)
		<-r.Context().Done()
	})
	tel := newTelemetry(t)
	a := newOpenAI(t, f, newMemstore(t), func(c *agent.OpenAIConfig) { c.Meter = tel.Meter() })
	m := samples(t, tel)
	for _, result := range upstreamResults {
		if v, ok := m[upstreamRequests(result)]; !ok || v != 0 {
			t.Errorf("a fresh agent: %s = %v (present %v), want 0", upstreamRequests(result), v, ok)
		}
	}

	if err := a.Handle(t.Context(), textEvent("mobile:tel-1", "m1", "hi"), &recOutput{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-gate; cancel() }()
	_ = a.Handle(ctx, textEvent("mobile:tel-1", "m2", "hi"), &recOutput{})

	m = samples(t, tel)
	for sample, want := range map[string]float64{
		upstreamRequests("ok"):                           1,
		upstreamRequests("canceled"):                     1,
		upstreamRequests("stream"):                       0,
		"hermes_agent_upstream_duration_seconds_count":   2,
		"hermes_agent_upstream_first_byte_seconds_count": 1,
	} {
		if m[sample] != want {
			t.Errorf("%s = %v, want %v", sample, m[sample], want)
		}
	}
}

// newTelemetry is a Telemetry shut down when t ends.
func newTelemetry(t *testing.T) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	return tel
}

// samples scrapes tel's /metrics: sample name{labels} → value.
func samples(t *testing.T, tel *telemetry.Telemetry) map[string]float64 {
	t.Helper()
	return testsvc.Samples(t, tel.Handler())
}

// TestOpenAIMaxAnswer: an answer of exactly MaxAnswer bytes is whole; one
// byte more is cut at MaxAnswer and says so, without splitting a character.
func TestOpenAIMaxAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		deltas []string
		want   string
	}{
		{"exactly", []string{"12345", "67890"}, "1234567890"},
		{"one more", []string{"12345", "67890", "X"}, "1234567890\n\n[The answer was cut: it is longer than 10 bytes.]"},
		{"inside a character", []string{"12345678", "é"}, "12345678é"},
		{"cut before a character", []string{"123456789", "é"}, "123456789\n\n[The answer was cut: it is longer than 10 bytes.]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fakellm.New(t, func(w http.ResponseWriter, r *http.Request, _ int) { fakellm.Stream(w, r, 0, tc.deltas...) })
			s := newMemstore(t)
			a := newOpenAI(t, f, s, func(c *agent.OpenAIConfig) { c.MaxAnswer = 10 })
			out := &recOutput{}
			if err := a.Handle(t.Context(), textEvent("mobile:tel-1", "m", "hi"), out); err != nil {
				t.Fatal(err)
			}
			calls := out.Calls()
			fin := calls[len(calls)-2]
			if !fin.final || fin.text != tc.want || calls[len(calls)-1].op != "typing:stop" {
				t.Fatalf("final %+v then %+v, want the text %q and typing:stop", fin, calls[len(calls)-1], tc.want)
			}
		})
	}
}

// TestOpenAITypingWhileWaiting: typing repeats until the first delta, so the
// avatar stays thinking through a slow start: an upstream that answers only
// once it has seen three typing calls gets its answer through.
func TestOpenAITypingWhileWaiting(t *testing.T) {
	out := &recOutput{}
	typing := func() int {
		n := 0
		for _, c := range out.Calls() {
			if c.op == "message" {
				break
			}
			if c.op == "typing" {
				n++
			}
		}
		return n
	}
	f := fakellm.New(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if !testsvc.Eventually(5*time.Second, func() bool { return typing() >= 3 }) {
			t.Errorf("%d typing calls while the upstream kept the first delta back, with TypingEvery 100 ms; want at least 3", typing())
		}
		fakellm.Stream(w, r, 0, "late")
	})
	a := newOpenAI(t, f, newMemstore(t), func(c *agent.OpenAIConfig) { c.TypingEvery = 100 * time.Millisecond })
	if err := a.Handle(t.Context(), textEvent("mobile:tel-1", "m", "hi"), out); err != nil {
		t.Fatal(err)
	}
	if n := typing(); n < 3 {
		t.Errorf("%d typing calls before the first delta, want at least 3", n)
	}
}

func TestOpenAICheck(t *testing.T) {
	for _, tc := range []struct {
		cfg agent.OpenAIConfig
		ok  bool
	}{
		{agent.OpenAIConfig{Model: "m"}, true},
		{agent.OpenAIConfig{Model: "m", BaseURL: "http://127.0.0.1:11434/v1"}, true},
		{agent.OpenAIConfig{}, false},
		{agent.OpenAIConfig{Model: " "}, false},
		{agent.OpenAIConfig{Model: "m", BaseURL: "localhost:8000"}, false},
		{agent.OpenAIConfig{Model: "m", BaseURL: "ftp://x/v1"}, false},
	} {
		if err := tc.cfg.Check(); (err == nil) != tc.ok {
			t.Errorf("Check(%+v) = %v, want ok=%v", tc.cfg, err, tc.ok)
		}
		if _, err := agent.NewOpenAI(tc.cfg, nil); (err == nil) != tc.ok {
			t.Errorf("NewOpenAI(%+v) = %v, want ok=%v", tc.cfg, err, tc.ok)
		}
	}
}

// TestOpenAIMaxLine: a line of exactly MaxLine bytes is read (one byte more
// fails, see TestOpenAIFailures).
func TestOpenAIMaxLine(t *testing.T) {
	f := fakellm.New(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		io.WriteString(w, ": "+strings.Repeat("x", 254)+"\r\n\r\n")
		fakellm.Stream(w, r, 0, "fine")
	})
	a := newOpenAI(t, f, newMemstore(t), func(c *agent.OpenAIConfig) { c.MaxLine = 256 })
	out := &recOutput{}
	if err := a.Handle(t.Context(), textEvent("mobile:tel-1", "m", "hi"), out); err != nil {
		t.Fatal(err)
	}
	if msgs := messages(out.Calls()); msgs[len(msgs)-1].text != "fine" {
		t.Fatalf("answer %+v, want fine", msgs[len(msgs)-1])
	}
}
