package router_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestLinkConversation is the outside agent's loop: the phone's text
// appears on the event log, the agent answers through the API and the
// phone gets the answer.
func TestLinkConversation(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		phone := e.phone(t, dev)
		if err := phone.Text("m-1", "hello agent"); err != nil {
			t.Fatal(err)
		}
		if f := expect(t, phone, protocol.TypeAvatar); f.Str("state") != protocol.AvatarThinking {
			t.Fatalf("avatar %s, want thinking", f)
		}
		evs, _ := e.waitEvents(t, "", 1)
		ev := evs[0].Event
		if ev.Kind != wire.EventText || ev.Text != "hello agent" || ev.ID != "m-1" || ev.Device != dev ||
			ev.Session != "mobile:"+dev || ev.UserID != "u-1" {
			t.Fatalf("event %+v", ev)
		}

		session := "/v1/sessions/" + ev.Session
		wantOK(t, e.call(t, "POST", session+"/typing", agentToken, nil))
		expect(t, phone, protocol.TypeTyping)

		// A streamed answer: a first part, then the complete text as an edit.
		r := e.call(t, "POST", session+"/messages", agentToken, map[string]any{"text": "Hel", "final": false})
		id, _ := wantOK(t, r)["id"].(string)
		if id == "" {
			t.Fatalf("message answered %s, want its id", r.body)
		}
		wantOK(t, e.call(t, "POST", session+"/messages", agentToken, map[string]any{"id": id, "text": "Hello, phone", "edit": true}))
		text, frames, err := phone.CollectMessage(ctxFor(t, 10*time.Second), id)
		if err != nil || text != "Hello, phone" {
			t.Fatalf("the phone got %q, %v", text, err)
		}
		if len(frames) != 2 || frames[0].Bool("final") || !frames[1].Bool("final") || !frames[1].Bool("edit") {
			t.Fatalf("frames %v: want a part that is not final and a final edit", frames)
		}

		// A long answer is cut into chunks by the edge; a session without
		// the prefix works too.
		long := strings.Repeat("long answer ", 1000)
		r = e.call(t, "POST", "/v1/sessions/"+dev+"/messages", agentToken, map[string]any{"id": "a-2", "text": long})
		if wantOK(t, r)["id"] != "a-2" {
			t.Fatalf("message answered %s, want the id given", r.body)
		}
		if text, frames, err := phone.CollectMessage(ctxFor(t, 10*time.Second), "a-2"); err != nil || text != long || len(frames) != 4 {
			t.Fatalf("long answer: %d frames, %d characters, %v", len(frames), len(text), err)
		}

		wantOK(t, e.call(t, "POST", session+"/typing", agentToken, map[string]any{"stop": true}))
		if f := expect(t, phone, protocol.TypeTyping); !f.Bool("stop") {
			t.Fatalf("typing %s, want stop", f)
		}
		if f := expect(t, phone, protocol.TypeAvatar); f.Str("state") != protocol.AvatarIdle {
			t.Fatalf("avatar %s after typing stop, want idle", f)
		}
		wantOK(t, e.call(t, "POST", session+"/avatar", agentToken, map[string]any{"state": "thinking"}))
		if f := expect(t, phone, protocol.TypeAvatar); f.Str("state") != protocol.AvatarThinking {
			t.Fatalf("avatar %s, want thinking", f)
		}
	})
}

// TestAgentOutputOffline: what the agent sends to a device that is offline
// waits in its outbox, like the built-in agents' output.
func TestAgentOutputOffline(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("away")
		session := "/v1/sessions/mobile:" + dev
		wantOK(t, e.call(t, "POST", session+"/typing", agentToken, nil)) // not kept
		wantOK(t, e.call(t, "POST", session+"/messages", agentToken, map[string]any{"id": "o-1", "text": "while you were away"}))
		r := e.call(t, "POST", session+"/prompts", agentToken, map[string]any{"kind": "slash_confirm", "text": "Proceed?"})
		card, _ := wantOK(t, r)["id"].(string)
		wantOK(t, e.call(t, "POST", session+"/media", agentToken, map[string]any{"id": "o-2", "kind": "image", "data": []byte("png bytes")}))

		phone := e.phone(t, dev)
		msg := expect(t, phone, protocol.TypeMessage)
		if msg.Str("id") != "o-1" || msg.Str("text") != "while you were away" {
			t.Fatalf("first after ready: %s", msg)
		}
		if p := expect(t, phone, protocol.TypePrompt); p.Str("id") != card {
			t.Fatalf("prompt %s, want card %s", p, card)
		}
		if _, data, err := phone.CollectMedia(ctxFor(t, 10*time.Second), "o-2"); err != nil || string(data) != "png bytes" {
			t.Fatalf("media from the outbox: %q, %v", data, err)
		}
	})
}

func TestAgentRejects(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		s := "/v1/sessions/mobile:" + dev
		for _, tc := range []struct {
			name, path string
			body       any
			status     int
			code       string
		}{
			{"message without text", s + "/messages", map[string]any{"id": "x"}, 400, "bad_frame"},
			{"edit without id", s + "/messages", map[string]any{"text": "x", "edit": true}, 400, "bad_frame"},
			{"message too long", s + "/messages", map[string]any{"text": strings.Repeat("x", 100_001)}, 413, "too_big"},
			{"message not JSON", s + "/messages", "text", 400, "bad_frame"},
			{"empty session", "/v1/sessions/mobile:/messages", map[string]any{"text": "x"}, 400, "bad_frame"},
			{"media without kind", s + "/media", map[string]any{"data": []byte("x")}, 400, "bad_frame"},
			{"media of an upload kind", s + "/media", map[string]any{"kind": "audio", "data": []byte("x")}, 400, "unsupported_frame"},
			{"media without data, blob or url", s + "/media", map[string]any{"kind": "image"}, 400, "bad_frame"},
			{"media over 8 MiB", s + "/media", `{"kind":"image","data":"` + base64.StdEncoding.EncodeToString(make([]byte, protocol.MaxMediaBytes+1)) + `"}`, 413, "too_big"},
			{"media caption too long", s + "/media", map[string]any{"kind": "image", "data": []byte("x"), "caption": strings.Repeat("c", 12001)}, 413, "too_big"},
			{"media of a gone blob", s + "/media", map[string]any{"kind": "image", "blob": "0123456789abcdef0123456789abcdef"}, 400, "bad_frame"},
			{"media url not http", s + "/media", map[string]any{"kind": "image", "url": "file:///etc/passwd"}, 400, "bad_frame"},
			{"prompt of no kind", s + "/prompts", map[string]any{"kind": "poll", "text": "?"}, 400, "bad_frame"},
			{"prompt without text", s + "/prompts", map[string]any{"kind": "clarify"}, 400, "bad_frame"},
			{"prompt with too many choices", s + "/prompts", map[string]any{"kind": "clarify", "text": "?", "choices": make([]string, 33)}, 413, "too_big"},
			{"prompt with an empty choice", s + "/prompts", map[string]any{"kind": "clarify", "text": "?", "choices": []string{"a", ""}}, 400, "bad_frame"},
			{"unknown avatar state", s + "/avatar", map[string]any{"state": "dancing"}, 400, "bad_frame"},
			{"typing stop not a bool", s + "/typing", map[string]any{"stop": "yes"}, 400, "bad_frame"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				wantError(t, e.call(t, "POST", tc.path, agentToken, tc.body), tc.status, tc.code)
			})
		}
	})
}

// TestLinkPrompts: a card opened through the API reaches the phone, and
// its answer (and another card's expiry) reaches the agent as events.
func TestLinkPrompts(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		phone := e.phone(t, dev)
		session := "/v1/sessions/mobile:" + dev
		r := e.call(t, "POST", session+"/prompts", agentToken, map[string]any{
			"kind": "exec_approval", "text": "Run this command?", "command": "rm -rf /tmp/cache", "description": "frees space",
		})
		id, _ := wantOK(t, r)["id"].(string)
		card := expect(t, phone, protocol.TypePrompt)
		if card.Str("id") != id || card.Str("kind") != "exec_approval" || card.Str("command") != "rm -rf /tmp/cache" ||
			card.Str("description") != "frees space" || card.Str("session") != "mobile:"+dev || len(card.Slice("options")) != 4 {
			t.Fatalf("card %s, want exec_approval %s", card, id)
		}
		if err := phone.Answer(id, "session", ""); err != nil {
			t.Fatal(err)
		}
		if done := expect(t, phone, protocol.TypePromptDone); done.Str("id") != id || done.Str("option_id") != "session" {
			t.Fatalf("prompt_done %s", done)
		}

		r = e.call(t, "POST", session+"/prompts", agentToken, map[string]any{
			"kind": "clarify", "text": "Which one?", "choices": []string{"red", "blue"},
		})
		id2, _ := wantOK(t, r)["id"].(string)
		if card := expect(t, phone, protocol.TypePrompt); card.Str("id") != id2 || len(card.Slice("options")) != 3 {
			t.Fatalf("clarify card %s", card)
		}
		if err := phone.Answer(id2, "", "green"); err != nil {
			t.Fatal(err)
		}
		expect(t, phone, protocol.TypePromptDone)

		evs, _ := e.waitEvents(t, "", 2)
		for i, want := range []wire.PromptRef{
			{ID: id, Kind: "exec_approval", Option: "session"},
			{ID: id2, Kind: "clarify", Option: "other", Text: "green"},
		} {
			ev := evs[i].Event
			if ev.Kind != wire.EventPrompt || ev.Device != dev || ev.Prompt == nil || *ev.Prompt != want {
				t.Fatalf("event %d: %+v (prompt %+v), want %+v", i, ev, ev.Prompt, want)
			}
		}
	})
}

// TestLinkMedia: a file the phone uploads reaches the agent as an event
// with a blob, whose bytes GET /v1/blobs gives; the agent sends files back
// by blob and by data.
func TestLinkMedia(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		phone := e.phone(t, dev)
		file := make([]byte, 300_000)
		for i := range file {
			file[i] = byte(i * 7)
		}
		if err := phone.UploadFile("up-1", "image", "image/png", "cat.png", "my cat", file, 100_000); err != nil {
			t.Fatal(err)
		}
		evs, _ := e.waitEvents(t, "", 1)
		ev := evs[0].Event
		m := ev.Media
		if ev.Kind != wire.EventMedia || ev.ID != "up-1" || m == nil || m.Blob == "" || m.Size != len(file) ||
			m.Kind != "image" || m.Mime != "image/png" || m.Filename != "cat.png" || m.Caption != "my cat" {
			t.Fatalf("event %+v, media %+v", ev, m)
		}

		r := e.call(t, "GET", "/v1/blobs/"+m.Blob+"?mime="+m.Mime, agentToken, nil)
		if r.status != http.StatusOK || !bytes.Equal(r.body, file) {
			t.Fatalf("GET blob: %d, %d bytes, want %d", r.status, len(r.body), len(file))
		}
		if ct := r.header.Get("Content-Type"); ct != "image/png" {
			t.Fatalf("blob Content-Type %q, want image/png", ct)
		}
		r = e.call(t, "GET", "/v1/blobs/"+m.Blob, agentToken, nil)
		if ct := r.header.Get("Content-Type"); ct != "application/octet-stream" || !bytes.Equal(r.body, file) {
			t.Fatalf("blob without mime: Content-Type %q", ct)
		}
		r = callURL(t, e.url, "GET", "/v1/blobs/"+m.Blob, agentToken, nil, http.Header{"Range": {"bytes=10-19"}})
		if r.status != http.StatusPartialContent || !bytes.Equal(r.body, file[10:20]) {
			t.Fatalf("blob range: %d %q", r.status, r.body)
		}
		wantError(t, e.call(t, "GET", "/v1/blobs/0123456789abcdef0123456789abcdef", agentToken, nil), http.StatusNotFound, "not_found")

		// Back by reference: the blob is not sent through the API again.
		session := "/v1/sessions/mobile:" + dev
		r = e.call(t, "POST", session+"/media", agentToken, map[string]any{
			"kind": "image", "blob": m.Blob, "mime": "image/png", "filename": "same.png", "caption": "your cat", "reply_to": "up-1",
		})
		id, _ := wantOK(t, r)["id"].(string)
		meta, data, err := phone.CollectMedia(ctxFor(t, 10*time.Second), id)
		if err != nil || !bytes.Equal(data, file) {
			t.Fatalf("media by blob: %d bytes, %v", len(data), err)
		}
		if meta.Str("reply_to") != "up-1" || meta.Str("caption") != "your cat" || meta.Str("filename") != "same.png" || meta.Int("size") != len(file) {
			t.Fatalf("media by blob: %s", meta)
		}

		// By data.
		doc := []byte(strings.Repeat("notes\n", 1000))
		wantOK(t, e.call(t, "POST", session+"/media", agentToken, map[string]any{"id": "doc-1", "kind": "document", "filename": "notes.txt", "data": doc}))
		meta, data, err = phone.CollectMedia(ctxFor(t, 10*time.Second), "doc-1")
		if err != nil || !bytes.Equal(data, doc) || meta.Str("mime") != "text/plain; charset=utf-8" {
			t.Fatalf("media by data: %s, %d bytes, %v", meta, len(data), err)
		}

		// By URL: the app downloads it itself.
		wantOK(t, e.call(t, "POST", session+"/media", agentToken, map[string]any{"id": "u-1", "kind": "video", "url": "https://example.com/v.mp4"}))
		meta, data, err = phone.CollectMedia(ctxFor(t, 10*time.Second), "u-1")
		if err != nil || meta.Str("url") != "https://example.com/v.mp4" || len(data) != 0 {
			t.Fatalf("media by url: %s, %d bytes, %v", meta, len(data), err)
		}
	})
}

// TestLinkEventsAreEverything: audio and card expiry reach the log too.
func TestLinkEventsAreEverything(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		phone := e.phone(t, dev)
		if err := phone.Audio("v-1", "ogg", []byte("OggS voice"), "what time is it"); err != nil {
			t.Fatal(err)
		}
		evs, cursor := e.waitEvents(t, "", 1)
		if ev := evs[0].Event; ev.Kind != wire.EventAudio || ev.Format != "ogg" || ev.Text != "what time is it" || ev.Media == nil || ev.Media.Blob == "" {
			t.Fatalf("audio event %+v", ev)
		}
		r := e.call(t, "GET", "/v1/blobs/"+evs[0].Event.Media.Blob, agentToken, nil)
		if string(r.body) != "OggS voice" {
			t.Fatalf("audio blob %q", r.body)
		}
		for i := range 3 {
			if err := phone.Text(fmt.Sprint("t-", i), fmt.Sprint("text ", i)); err != nil {
				t.Fatal(err)
			}
		}
		evs, _ = e.waitEvents(t, cursor, 3)
		for i, ev := range evs {
			if ev.Event.Text != fmt.Sprint("text ", i) {
				t.Fatalf("event %d: %+v", i, ev.Event)
			}
		}
	})
}

// TestLinkPromptBounds: a card shows only the options the agent offers (an
// answer outside them is the safe one), lives at most timeout_seconds, and
// closes on the phone when the agent closes it; a late answer then finds no
// card and reaches nobody.
func TestLinkPromptBounds(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		phone := e.phone(t, dev)
		session := "/v1/sessions/mobile:" + dev
		r := e.call(t, "POST", session+"/prompts", agentToken, map[string]any{
			"kind": "exec_approval", "text": "Run?", "command": "curl x | sh", "options": []string{"once"}, "timeout_seconds": 7,
		})
		id, _ := wantOK(t, r)["id"].(string)
		card := expect(t, phone, protocol.TypePrompt)
		var ids []string
		for _, o := range card.Slice("options") {
			ids = append(ids, o.(map[string]any)["id"].(string))
		}
		if fmt.Sprint(ids) != "[once deny]" || card.Int("timeout_seconds") != 7 {
			t.Fatalf("card %s, want options [once deny] and timeout_seconds 7", card)
		}
		if err := phone.Answer(id, "always", ""); err != nil {
			t.Fatal(err)
		}
		if done := expect(t, phone, protocol.TypePromptDone); done.Str("option_id") != "deny" {
			t.Fatalf("prompt_done %s, want deny for a button the card did not show", done)
		}

		r = e.call(t, "POST", session+"/prompts", agentToken, map[string]any{"kind": "slash_confirm", "text": "Reload?"})
		id2, _ := wantOK(t, r)["id"].(string)
		expect(t, phone, protocol.TypePrompt)
		wantOK(t, e.call(t, "DELETE", session+"/prompts/"+id2, agentToken, nil))
		if done := expect(t, phone, protocol.TypePromptDone); done.Str("id") != id2 || !done.Bool("expired") {
			t.Fatalf("prompt_done %s, want %s expired", done, id2)
		}
		wantError(t, e.call(t, "DELETE", session+"/prompts/"+id2, agentToken, nil), 404, "not_found")
		if err := phone.Answer(id2, "once", ""); err != nil {
			t.Fatal(err)
		}
		if done := expect(t, phone, protocol.TypePromptDone); done.Str("id") != id2 || !done.Bool("expired") {
			t.Fatalf("late answer: prompt_done %s, want expired", done)
		}
		evs, _ := e.waitEvents(t, "", 1)
		if len(evs) != 1 || evs[0].Event.Prompt.ID != id {
			t.Fatalf("events %+v, want only the first card's answer", evs)
		}
		if evs[0].Event.Auth != "app" {
			t.Fatalf("event auth %q, want app: the phone showed MOBILE_TOKEN", evs[0].Event.Auth)
		}

		for _, tc := range []struct {
			name string
			body map[string]any
		}{
			{"unknown option", map[string]any{"kind": "exec_approval", "text": "?", "options": []string{"sometimes"}}},
			{"options on clarify", map[string]any{"kind": "clarify", "text": "?", "options": []string{"c0"}}},
			{"negative timeout", map[string]any{"kind": "slash_confirm", "text": "?", "timeout_seconds": -1}},
		} {
			wantError(t, e.call(t, "POST", session+"/prompts", agentToken, tc.body), 400, "bad_frame")
		}
	})
}
