package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// chatRequest is the body of POST /chat/completions.
type chatRequest struct {
	Model    string        `json:"model"`
	Messages []chatMessage `json:"messages"`
	Stream   bool          `json:"stream"`
}

// chatChunk is one event of the stream; Error is what some servers send
// instead when they fail mid-stream.
type chatChunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// errCut stops the stream when the answer reached MaxAnswer.
var errCut = errors.New("the answer is too long")

// answer is what stream got: the text (cut at MaxAnswer bytes, then cut
// is set), and whether its first part went to the device (started).
type answer struct {
	text         string
	started, cut bool
}

// stream sends msgs upstream and streams the answer to the device as
// message id: the first delta as a message, the following ones as edits at
// most every EditEvery, typing every TypingEvery until the first delta. It
// does not send the final frame. On an error the answer holds what was
// received so far.
func (o *OpenAI) stream(ctx context.Context, msgs []chatMessage, id string, out Output) (answer, error) {
	body, err := json.Marshal(chatRequest{Model: o.cfg.Model, Messages: msgs, Stream: true})
	if err != nil {
		return answer{}, err
	}
	ctx, cancelTimeout := context.WithTimeoutCause(ctx, o.cfg.Timeout,
		resultErrorf(resultTimeout, "upstream did not finish the answer within %v", o.cfg.Timeout))
	defer cancelTimeout()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	firstByte := time.AfterFunc(o.cfg.FirstByte, func() {
		cancel(resultErrorf(resultTimeout, "upstream sent nothing within %v", o.cfg.FirstByte))
	})
	defer firstByte.Stop()

	deltas := make(chan string)
	done := make(chan error, 1)
	go func() { done <- o.read(ctx, body, deltas, firstByte) }()
	stop := func(cause error) {
		cancel(cause)
		<-done //nolint:errcheck // waits for the reader, whose error is cause or follows from it
	}

	typing := time.NewTicker(o.cfg.TypingEvery)
	defer typing.Stop()
	edit := time.NewTimer(0)
	<-edit.C
	var (
		text    strings.Builder
		sent    string    // the text the device was sent
		sentAt  time.Time // when
		pending bool      // edit is armed
	)
	result := func(cut bool) answer { return answer{text: text.String(), started: sent != "", cut: cut} }
	send := func() error {
		if err := out.Message(ctx, id, text.String(), sent != "", false); err != nil {
			return err
		}
		sent, sentAt = text.String(), time.Now()
		return nil
	}
	for {
		select {
		case d := <-deltas:
			if text.Len()+len(d) > o.cfg.MaxAnswer {
				text.WriteString(cutUTF8(d, o.cfg.MaxAnswer-text.Len()))
				stop(errCut)
				return result(true), nil
			}
			text.WriteString(d)
			switch wait := o.cfg.EditEvery - time.Since(sentAt); {
			case sent != "" && pending:
			case sent != "" && wait > 0:
				edit.Reset(wait)
				pending = true
			default:
				if err := send(); err != nil {
					stop(err)
					return result(false), err
				}
			}
		case <-edit.C:
			pending = false
			if text.String() != sent {
				if err := send(); err != nil {
					stop(err)
					return result(false), err
				}
			}
		case <-typing.C:
			if sent == "" {
				if err := out.Typing(ctx, false); err != nil {
					stop(err)
					return result(false), err
				}
			}
		case err := <-done:
			return result(false), err
		}
	}
}

// read posts body and sends each non-empty content delta of the stream to
// deltas. It returns nil once the stream says it is done, or why it is not.
// The call is counted by its result (resultOf).
func (o *OpenAI) read(ctx context.Context, body []byte, deltas chan<- string, firstByte *time.Timer) (err error) {
	start := time.Now()
	defer func() { o.m.call(start, err) }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if o.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.cfg.APIKey)
	}
	resp, err := o.cfg.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return resultErrorf(resultUnreachable, "cannot reach upstream: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return statusError(resp)
	}

	sc := bufio.NewScanner(resp.Body)
	// Room for the line ending, so that a line of MaxLine bytes is read.
	sc.Buffer(make([]byte, 0, min(4096, o.cfg.MaxLine+2)), o.cfg.MaxLine+2)
	var data []byte // the data lines of the event being read
	finished := false
	// dispatch handles one event; done reports the end of the stream.
	dispatch := func() (done bool, err error) {
		if len(data) == 0 {
			return false, nil
		}
		defer func() { data = data[:0] }()
		if string(bytes.TrimSpace(data)) == "[DONE]" {
			return true, nil
		}
		var c chatChunk
		if err := json.Unmarshal(data, &c); err != nil {
			return false, resultErrorf(resultStream, "upstream sent a malformed stream: %q is not a JSON chunk", clip(string(data), 80))
		}
		if c.Error != nil {
			return false, resultErrorf(resultStream, "upstream failed: %s", clip(c.Error.Message, 200))
		}
		if len(c.Choices) == 0 {
			return false, nil
		}
		ch := c.Choices[0]
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			finished = true
		}
		if d := ch.Delta.Content; d != "" {
			select {
			case deltas <- d:
			case <-ctx.Done():
				return false, context.Cause(ctx)
			}
		}
		return false, nil
	}
	first := true
	for sc.Scan() {
		if first {
			firstByte.Stop()
			o.m.firstLine(start)
			first = false
		}
		line := sc.Bytes()
		if len(line) > o.cfg.MaxLine {
			return resultErrorf(resultStream, "upstream sent a line longer than %d bytes", o.cfg.MaxLine)
		}
		if len(line) == 0 {
			if done, err := dispatch(); done || err != nil {
				return err
			}
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if string(field) != "data" {
			continue // a comment, event:, id: or retry:
		}
		if len(data) > 0 {
			data = append(data, '\n')
		}
		data = append(data, bytes.TrimPrefix(value, []byte(" "))...)
		if len(data) > o.cfg.MaxLine {
			return resultErrorf(resultStream, "upstream sent an event longer than %d bytes", o.cfg.MaxLine)
		}
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	switch err := sc.Err(); {
	case errors.Is(err, bufio.ErrTooLong):
		return resultErrorf(resultStream, "upstream sent a line longer than %d bytes", o.cfg.MaxLine)
	case err != nil:
		return resultErrorf(resultStream, "reading the stream: %w", err)
	}
	if done, err := dispatch(); done || err != nil {
		return err
	}
	if !finished {
		return resultErrorf(resultStream, "the stream from upstream ended before the answer was complete")
	}
	return nil
}

// statusError describes a response that is not 200, with the error message
// of its body when it has one.
func statusError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &e) == nil && len(e.Error) > 0 {
		var obj struct{ Message string }
		var s string
		switch {
		case json.Unmarshal(e.Error, &obj) == nil && obj.Message != "":
			msg = obj.Message
		case json.Unmarshal(e.Error, &s) == nil && s != "":
			msg = s
		}
	}
	if msg == "" {
		return resultErrorf(resultStatus, "upstream returned %s", resp.Status)
	}
	return resultErrorf(resultStatus, "upstream returned %s: %s", resp.Status, clip(msg, 200))
}

// describe is err as the device reads it, to be followed by a full stop.
func describe(err error) string {
	return strings.TrimRight(clip(err.Error(), 300), ".")
}

// clip shortens s to at most n runes on one line.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// cutUTF8 returns the longest prefix of s of at most n bytes that does not
// split a character.
func cutUTF8(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
