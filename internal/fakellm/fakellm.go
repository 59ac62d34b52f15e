// Package fakellm is an OpenAI-compatible chat completions server on
// loopback for tests: it records every request and answers as the test
// says, usually with Stream.
package fakellm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is the fake upstream. Its URL + "/v1" is an OPENAI_BASE_URL.
type Server struct {
	*httptest.Server
	reply func(w http.ResponseWriter, r *http.Request, n int)

	mu   sync.Mutex
	reqs []Request
}

// Request is a request as the server saw it.
type Request struct {
	Path, Auth, Accept string
	Body               struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
}

// Text is message i's content when it is a string ("" for a list of parts).
func (r Request) Text(i int) string {
	var s string
	_ = json.Unmarshal(r.Body.Messages[i].Content, &s) // a list of parts leaves s empty
	return s
}

// Roles lists the roles of the messages, comma-separated.
func (r Request) Roles() string {
	var out []string
	for _, m := range r.Body.Messages {
		out = append(out, m.Role)
	}
	return strings.Join(out, ",")
}

// New starts a server that answers request n (counted from 0) with reply.
// A body that is not JSON fails the test.
func New(t testing.TB, reply func(w http.ResponseWriter, r *http.Request, n int)) *Server {
	s := &Server{reply: reply}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req Request
		req.Path, req.Auth, req.Accept = r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("Accept")
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &req.Body); err != nil {
			t.Errorf("the request body is not JSON: %v: %.200s", err, body)
		}
		s.mu.Lock()
		n := len(s.reqs)
		s.reqs = append(s.reqs, req)
		s.mu.Unlock()
		s.reply(w, r, n)
	}))
	t.Cleanup(s.Close)
	return s
}

// Requests returns the requests so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

// Stream answers with one SSE event per delta, pause apart, then the finish
// chunk and [DONE]. It stops early when the client goes away.
func Stream(w http.ResponseWriter, r *http.Request, pause time.Duration, deltas ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for _, d := range deltas {
		b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]string{"content": d}, "finish_reason": nil}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
		select {
		case <-time.After(pause):
		case <-r.Context().Done():
			return
		}
	}
	io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
}
