package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// chatMessage is one message of a chat completion request. Content is a
// string, or a []contentPart for a message with an image. The history keeps
// messages with string content only.
type chatMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

// contentPart is a part of a message: text, or an image given by URL (here
// always a data: URL).
type contentPart struct {
	Type     string    `json:"type"`
	Text     string    `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL string `json:"url"`
}

// userMessage turns ev into the user message of the request (msg) and the
// text-only message the history keeps for it (record).
func (o *OpenAI) userMessage(ctx context.Context, ev wire.Event, out Output) (msg, record chatMessage, err error) {
	text := func(s string) (chatMessage, chatMessage, error) {
		m := chatMessage{Role: "user", Content: s}
		return m, m, nil
	}
	switch ev.Kind {
	case wire.EventText:
		return text(ev.Text)
	case wire.EventAudio:
		if ev.Text != "" {
			return text(ev.Text)
		}
		size := 0
		if ev.Media != nil {
			size = ev.Media.Size
		}
		return text(fmt.Sprintf("[The user sent a voice message (%d bytes, %s) without a transcript; you cannot hear it.]", size, ev.Format))
	}
	m := ev.Media
	if m == nil {
		return msg, record, errors.New("the event names no file")
	}
	note := fmt.Sprintf("[The user sent a file: %s (%s, %s, %d bytes); its content is not available to you.]",
		orDefault(m.Filename, "unnamed"), m.Kind, orDefault(m.Mime, "unknown type"), m.Size)
	if m.Kind != "image" || m.Blob == "" {
		return text(joinLines(note, m.Caption))
	}
	if m.Size > o.cfg.MaxImage {
		note = fmt.Sprintf("[The user sent an image: %s (%d bytes), too large to pass on (the limit is %d bytes).]",
			orDefault(m.Filename, "unnamed"), m.Size, o.cfg.MaxImage)
		return text(joinLines(note, m.Caption))
	}
	data, err := out.Blob(ctx, m.Blob)
	if err != nil {
		return msg, record, fmt.Errorf("reading the image: %w", err)
	}
	if len(data) > o.cfg.MaxImage {
		return text(joinLines(fmt.Sprintf("[The user sent an image too large to pass on (%d bytes).]", len(data)), m.Caption))
	}
	mime := m.Mime
	if !strings.HasPrefix(mime, "image/") {
		mime = http.DetectContentType(data)
	}
	var parts []contentPart
	if m.Caption != "" {
		parts = append(parts, contentPart{Type: "text", Text: m.Caption})
	}
	parts = append(parts, contentPart{Type: "image_url",
		ImageURL: &imageURL{URL: "data:" + mime + ";base64," + base64.StdEncoding.EncodeToString(data)}})
	msg = chatMessage{Role: "user", Content: parts}
	record = chatMessage{Role: "user", Content: joinLines("[The user sent an image: "+orDefault(m.Filename, "unnamed")+".]", m.Caption)}
	return msg, record, nil
}

// request is the messages of a request: the system prompt, the session's
// history and user. A history that cannot be read is left out: an answer
// without it beats none.
func (o *OpenAI) request(ctx context.Context, session string, user chatMessage) []chatMessage {
	var msgs []chatMessage
	if o.cfg.SystemPrompt != "" {
		msgs = append(msgs, chatMessage{Role: "system", Content: o.cfg.SystemPrompt})
	}
	items, err := o.history.History(ctx, session)
	if err != nil {
		o.log.Warn("reading the conversation history failed; answering without it", "session", session, "err", err)
	}
	for _, it := range items {
		var m struct{ Role, Content string }
		if json.Unmarshal(it, &m) != nil || (m.Role != "user" && m.Role != "assistant") {
			continue
		}
		msgs = append(msgs, chatMessage{Role: m.Role, Content: m.Content})
	}
	return append(msgs, user)
}

// remember appends a turn to the session's history.
func (o *OpenAI) remember(ctx context.Context, session string, turn ...chatMessage) error {
	items := make([][]byte, len(turn))
	for i, m := range turn {
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		items[i] = b
	}
	lim := store.HistoryLimits{MaxItems: o.cfg.HistoryLen, MaxBytes: o.cfg.HistorySize, TTL: o.cfg.HistoryTTL}
	if err := o.history.AppendHistory(ctx, session, items, lim); err != nil {
		return fmt.Errorf("openai: recording the turn: %w", err)
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// joinLines joins the non-empty strings with newlines.
func joinLines(ss ...string) string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return strings.Join(out, "\n")
}
