package gateway_test

// AGENT=openai end to end: a node whose router runs agent.OpenAI against an
// OpenAI-compatible server on loopback, driven through a real edge socket.

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/fakellm"
	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// newChatServer is a fake OpenAI-compatible upstream answering every
// request with reply.
func newChatServer(t *testing.T, reply func(w http.ResponseWriter, r *http.Request)) *fakellm.Server {
	return fakellm.New(t, func(w http.ResponseWriter, r *http.Request, _ int) { reply(w, r) })
}

// startOpenAINode starts a node whose agent is OpenAI on srv, with its
// configuration changed by tune (when not nil).
func startOpenAINode(t *testing.T, srv *fakellm.Server, mutate func(*gateway.Config), tune func(*agent.OpenAIConfig)) *node {
	oc := agent.OpenAIConfig{BaseURL: srv.URL + "/v1", Model: "phone-model", SystemPrompt: "Be brief.",
		EditEvery: 50 * time.Millisecond, Timeout: 5 * time.Second}
	if tune != nil {
		tune(&oc)
	}
	return startNode(t, func(cfg *gateway.Config) {
		cfg.NewAgent = agent.Named("openai", oc, 0)
		if mutate != nil {
			mutate(cfg)
		}
	})
}

// openAITurn sends text and reads the frames up to avatar idle.
func openAITurn(t *testing.T, c *client.Conn, id, text string) []avFrame {
	t.Helper()
	if err := c.Text(id, text); err != nil {
		t.Fatal(err)
	}
	return avRecord(t, c, avIsAvatar(protocol.AvatarIdle))
}

// checkAnswer checks a turn's frames: avatar thinking before the first
// message, one message id whose last frame is final with want, then typing
// stop and avatar idle. It returns the message frames.
func checkAnswer(t *testing.T, fs []avFrame, want string) []avFrame {
	t.Helper()
	desc := avDescribe(fs)
	t.Logf("frames: %v", desc)
	first := slices.Index(desc, "message")
	if first < 0 {
		t.Fatalf("no message frame: %v", desc)
	}
	if th := slices.Index(desc, "avatar:thinking"); th < 0 || th > first {
		t.Errorf("no avatar thinking before the first message: %v", desc)
	}
	var msgs []avFrame
	for i, d := range desc {
		if d == "message" {
			msgs = append(msgs, fs[i])
			if fs[i].Str("id") != fs[first].Str("id") {
				t.Errorf("two message ids in one answer: %v", desc)
			}
		}
	}
	last := msgs[len(msgs)-1]
	if !last.Bool("final") || last.Str("text") != want {
		t.Errorf("last message %s, want final with %q", last, want)
	}
	for _, m := range msgs[:len(msgs)-1] {
		if m.Bool("final") {
			t.Errorf("a final frame before the last: %s", m)
		}
	}
	if n := len(desc); n < 2 || desc[n-2] != "typing:stop" || desc[n-1] != "avatar:idle" {
		t.Errorf("the turn does not end with typing stop and avatar idle: %v", desc)
	}
	return msgs
}

// TestOpenAIAgentStreams: the phone sees avatar thinking, the first delta as
// a message, edits with the text so far, the final edit with the whole
// answer, typing stop and avatar idle; the upstream gets the model,
// stream:true, the system prompt and, on the second turn, the first turn.
func TestOpenAIAgentStreams(t *testing.T) {
	t.Parallel()
	deltas := []string{"The ", "sky ", "is ", "blue ", "because ", "of ", "Rayleigh ", "scattering."}
	answer := strings.Join(deltas, "")
	srv := newChatServer(t, func(w http.ResponseWriter, r *http.Request) { fakellm.Stream(w, r, 30*time.Millisecond, deltas...) })
	n := startOpenAINode(t, srv, nil, nil)
	c, _ := n.connect(t, "tel-oa")

	msgs := checkAnswer(t, openAITurn(t, c, "oa-1", "why is the sky blue?"), answer)
	if m := msgs[0]; m.Bool("edit") || m.Str("text") != "The " {
		t.Errorf("first message %s, want the first delta, not an edit", m)
	}
	edits := 0
	for _, m := range msgs[1:] {
		if !m.Bool("edit") || !strings.HasPrefix(answer, m.Str("text")) {
			t.Errorf("message %s: want an edit with the answer so far", m)
		}
		edits++
	}
	if edits < 2 || edits >= len(deltas) {
		t.Errorf("%d edits for %d deltas 30 ms apart with edits every 50 ms, want some, coalesced", edits, len(deltas))
	}

	checkAnswer(t, openAITurn(t, c, "oa-2", "and at sunset?"), answer)
	reqs := srv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d upstream requests, want 2", len(reqs))
	}
	if r := reqs[0]; r.Path != "/v1/chat/completions" || r.Body.Model != "phone-model" || !r.Body.Stream || r.Roles() != "system,user" ||
		r.Text(0) != "Be brief." || r.Text(1) != "why is the sky blue?" {
		t.Errorf("first request %+v", r)
	}
	if r := reqs[1]; r.Roles() != "system,user,assistant,user" || r.Text(1) != "why is the sky blue?" ||
		r.Text(2) != answer || r.Text(3) != "and at sunset?" {
		t.Errorf("second request %s: %q %q %q, want the first turn before the question", r.Roles(), r.Text(1), r.Text(2), r.Text(3))
	}
}

// TestOpenAIAgentMedia: an uploaded image reaches the upstream as a data URL
// with its caption, and a voice message as its recognised text.
func TestOpenAIAgentMedia(t *testing.T) {
	t.Parallel()
	srv := newChatServer(t, func(w http.ResponseWriter, r *http.Request) { fakellm.Stream(w, r, 0, "seen") })
	n := startOpenAINode(t, srv, nil, nil)
	c, _ := n.connect(t, "tel-oam")
	img := append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 5000)...)
	if err := c.UploadFile("img-1", "image", "image/png", "cat.png", "what is it?", img, 2048); err != nil {
		t.Fatal(err)
	}
	checkAnswer(t, avRecord(t, c, avIsAvatar(protocol.AvatarIdle)), "seen")
	if err := c.Audio("au-1", "ogg", []byte("OggS fake"), "remind me at nine"); err != nil {
		t.Fatal(err)
	}
	checkAnswer(t, avRecord(t, c, avIsAvatar(protocol.AvatarIdle)), "seen")

	reqs := srv.Requests()
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL struct {
			URL string `json:"url"`
		} `json:"image_url"`
	}
	if err := json.Unmarshal(reqs[0].Body.Messages[1].Content, &parts); err != nil {
		t.Fatalf("the image went as %s: %v", reqs[0].Body.Messages[1].Content, err)
	}
	want := "data:image/png;base64," + base64.StdEncoding.EncodeToString(img)
	if len(parts) != 2 || parts[0].Text != "what is it?" || parts[1].Type != "image_url" || parts[1].ImageURL.URL != want {
		t.Errorf("image parts %+v", parts)
	}
	last := reqs[1]
	if got := last.Text(len(last.Body.Messages) - 1); got != "remind me at nine" {
		t.Errorf("the voice message went as %q, want its recognised text", got)
	}
}

// TestOpenAIAgentFailures: an upstream error, an upstream that hangs past
// the timeout, a malformed stream and an answer over the bound each end in a
// final message saying so, typing stop and avatar idle.
func TestOpenAIAgentFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		reply  func(w http.ResponseWriter, r *http.Request)
		mutate func(*agent.OpenAIConfig)
		want   string
	}{
		{"status 502", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, `{"error":{"message":"no backend"}}`)
		}, nil, "The agent could not answer: upstream returned 502 Bad Gateway: no backend."},
		{"hangs", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
			func(c *agent.OpenAIConfig) { c.Timeout = 700 * time.Millisecond },
			"The agent could not answer: upstream did not finish the answer within 700ms."},
		{"malformed", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "data: {oops\n\n") }, nil,
			"The agent could not answer: upstream sent a malformed stream"},
		{"too long", func(w http.ResponseWriter, r *http.Request) { fakellm.Stream(w, r, 0, "0123456789", "abcdef") },
			func(c *agent.OpenAIConfig) { c.MaxAnswer = 12 },
			"0123456789ab\n\n[The answer was cut: it is longer than 12 bytes.]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newChatServer(t, tc.reply)
			n := startOpenAINode(t, srv, nil, tc.mutate)
			c, _ := n.connect(t, "tel-oaf")
			fs := openAITurn(t, c, "f-1", "hello?")
			desc := avDescribe(fs)
			t.Logf("frames: %v", desc)
			stop, lastMsg := slices.Index(desc, "typing:stop"), avLastIndex(desc, "message")
			if lastMsg < 0 || lastMsg > stop {
				t.Fatalf("no message before typing stop: %v", desc)
			}
			if last := fs[lastMsg]; !last.Bool("final") || !strings.HasPrefix(last.Str("text"), tc.want) {
				t.Errorf("the last message is %s, want a final one starting %q", last, tc.want)
			}
			if n := len(desc); desc[n-2] != "typing:stop" || desc[n-1] != "avatar:idle" {
				t.Errorf("the turn does not end with typing stop and avatar idle: %v", desc)
			}
		})
	}
}

// TestOpenAIAgentAcrossNodes: two nodes share a Redis; a conversation begun
// on the first continues on the second, which sends the first turn upstream.
func TestOpenAIAgentAcrossNodes(t *testing.T) {
	t.Parallel()
	redisURL := testsvc.RedisURL(t)
	prefix := randomPrefix()
	srv := newChatServer(t, func(w http.ResponseWriter, r *http.Request) { fakellm.Stream(w, r, 0, "Noted.") })
	onRedis := func(cfg *gateway.Config) { cfg.RedisURL, cfg.RedisPrefix = redisURL, prefix }
	a := startOpenAINode(t, srv, onRedis, nil)
	b := startOpenAINode(t, srv, onRedis, nil)
	dev := "tel-" + prefix[13:25]

	c1, _ := a.connect(t, dev)
	checkAnswer(t, openAITurn(t, c1, "x-1", "my name is Ada"), "Noted.")
	c1.Close()
	c2, _ := b.connect(t, dev)
	checkAnswer(t, openAITurn(t, c2, "x-2", "what is my name?"), "Noted.")

	reqs := srv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d upstream requests, want 2", len(reqs))
	}
	if r := reqs[1]; r.Roles() != "system,user,assistant,user" || r.Text(1) != "my name is Ada" || r.Text(2) != "Noted." {
		t.Fatalf("the second node sent %s: %q %q; want the first node's turn", r.Roles(), r.Text(1), r.Text(2))
	}
}
