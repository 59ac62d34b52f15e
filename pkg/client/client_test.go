package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, s *testServer, opts Options) *Conn {
	t.Helper()
	c, err := Dial(testContext(t), s.url, opts)
	if err != nil {
		t.Fatalf(
			"dial: %v",
			err,
		)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

// result carries what a server script saw back to the test.
type result struct {
	v   any
	err error
}

func await(t *testing.T, ch <-chan result) any {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf(
				"server: %v",
				r.err,
			)
		}
		return r.v
	case <-time.After(20 * time.Second):
		t.Fatalf(
			"server script did not report",
		)
	}
	return nil
}

func TestHelloReady(t *testing.T) {
	seen := make(chan result, 2)
	s := startServer(t, true, func(sc *serverConn) {
		f, err := sc.decode()
		if err != nil {
			seen <- result{err: err}
			return
		}
		seen <- result{v: f}
		h, _ := f.(*protocol.Hello)
		if h == nil {
			return
		}
		sc.send(protocol.AppendReady(nil, protocol.Ready{
			Session:    protocol.Session(h.Device.ID),
			DeviceID:   h.Device.ID,
			DeviceName: h.Device.Name,
			AvatarURL:  "https://agent.example.com/avatar/",
		}))
		code, err := sc.readClose()
		seen <- result{v: code, err: err}
	})
	c := dial(t, s, Options{Timeout: 5 * time.Second})
	ctx := testContext(t)

	dev := protocol.Device{ID: "tel-1", Name: "Phone", Platform: "android", AppVersion: "1.0.0"}
	user := protocol.User{ID: "u-1", Name: "Eugene"}
	ready, err := c.Hello(ctx, "secret", dev, user)
	if err != nil {
		t.Fatalf(
			"hello: %v",
			err,
		)
	}

	wantHello := &protocol.Hello{Token: "secret", Device: dev, User: user}
	if got := await(t, seen); !reflect.DeepEqual(got, wantHello) {
		t.Errorf(
			"server decoded hello %+v, want %+v",
			got, wantHello,
		)
	}
	if ready.T() != "ready" || ready.Int("v") != protocol.Version {
		t.Errorf(
			"ready: t=%q v=%d, want ready v=1",
			ready.T(), ready.Int("v"),
		)
	}
	if got := ready.Str("session"); got != "mobile:tel-1" {
		t.Errorf(
			"session %q, want mobile:tel-1",
			got,
		)
	}
	if got := ready.Map("device").Str("name"); got != "Phone" {
		t.Errorf(
			"device.name %q, want Phone",
			got,
		)
	}
	caps := ready.Map("capabilities")
	if !caps.Bool("edit") || caps.Int("max_media_bytes") != protocol.MaxMediaBytes || len(caps.Slice("media_out")) != 5 {
		t.Errorf(
			"capabilities not decoded: %v",
			caps,
		)
	}
	if !bytes.HasPrefix(ready.Raw(), []byte(`{"t":"ready","v":1,`)) || ready.Close() != nil || ready.Err() != nil {
		t.Errorf(
			"raw %q close %v err %v",
			ready.Raw(), ready.Close(), ready.Err(),
		)
	}
	if len(ready.Fields()) != 6 {
		t.Errorf(
			"Fields() = %v, want the 6 members of ready",
			ready.Fields(),
		)
	}

	if err := c.Close(); err != nil {
		t.Errorf(
			"close: %v",
			err,
		)
	}
	if got := await(t, seen); got != ws.StatusNormalClosure {
		t.Errorf(
			"server saw close code %v, want 1000",
			got,
		)
	}
	select {
	case <-c.Done():
	default:
		t.Errorf(
			"reader still running after Close",
		)
	}
	if _, err := c.Next(ctx); !errors.Is(err, io.EOF) {
		t.Errorf(
			"Next after Close: %v, want io.EOF",
			err,
		)
	}
	if err := c.Text("x", "late"); !errors.Is(err, ErrClosed) {
		t.Errorf(
			"Text after Close: %v, want ErrClosed",
			err,
		)
	}
}

func TestHelloRejected(t *testing.T) {
	echoed := make(chan result, 1)
	s := startServer(t, true, func(sc *serverConn) {
		if _, err := sc.decode(); err != nil {
			echoed <- result{err: err}
			return
		}
		sc.send(protocol.AppendError(nil, protocol.NewFatal(protocol.CodeAuthFailed, "invalid token")))
		sc.sendClose(protocol.CloseCode, string(protocol.CodeAuthFailed))
		h, p, err := sc.readFrame()
		if err == nil && h.OpCode != ws.OpClose {
			err = errors.New("client answered close with " + string(p))
		}
		code, _ := ws.ParseCloseFrameData(p)
		echoed <- result{v: code, err: err}
	})
	c := dial(t, s, Options{})
	ctx := testContext(t)

	ready, err := c.Hello(ctx, "wrong", protocol.Device{ID: "tel-1"}, protocol.User{})
	var se *ServerError
	if !errors.As(err, &se) || !ready.IsZero() {
		t.Fatalf(
			"hello: ready %v, err %v; want a *ServerError",
			ready, err,
		)
	}
	if se.Code != protocol.CodeAuthFailed || !se.Fatal || se.Message != "invalid token" || se.Frame.T() != "error" {
		t.Errorf(
			"server error %+v",
			se,
		)
	}
	ci, err := c.ExpectClose(ctx)
	if err != nil || ci.Code != protocol.CloseCode || ci.Reason != "auth_failed" {
		t.Errorf(
			"ExpectClose = %v, %v; want 1008 auth_failed",
			ci, err,
		)
	}
	if got := await(t, echoed); got != ws.StatusCode(protocol.CloseCode) {
		t.Errorf(
			"client answered the close with code %v, want 1008",
			got,
		)
	}
	if _, err := c.Next(ctx); !errors.Is(err, io.EOF) {
		t.Errorf(
			"Next after the close: %v, want io.EOF",
			err,
		)
	}
}

func TestServerCloseSurfacesAsFrame(t *testing.T) {
	s := startServer(t, true, func(sc *serverConn) {
		sc.send([]byte(`{"t":"avatar","state":"thinking"}`))
		sc.sendClose(protocol.CloseCode, "too_big")
		_, _ = sc.readClose()
	})
	c := dial(t, s, Options{})
	ctx := testContext(t)

	f, err := c.Next(ctx)
	if err != nil || f.T() != "avatar" || f.Str("state") != "thinking" {
		t.Fatalf(
			"first frame %v, %v; want avatar thinking",
			f, err,
		)
	}
	f, err = c.Next(ctx)
	if err != nil {
		t.Fatalf(
			"close frame: %v",
			err,
		)
	}
	if f.T() != "" || f.Close() == nil || f.Close().Code != 1008 || f.Close().Reason != "too_big" {
		t.Fatalf(
			"got %v (close %v), want a close 1008 too_big",
			f, f.Close(),
		)
	}
	_, err = c.Next(ctx)
	if !errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "1008 too_big") {
		t.Errorf(
			"Next after the close: %v, want io.EOF naming the close",
			err,
		)
	}
	<-c.Done()
	if err := c.Text("t1", "hi"); !errors.Is(err, ErrClosed) {
		t.Errorf(
			"Text after the server closed: %v, want ErrClosed",
			err,
		)
	}
}

func TestExpectSkipsAndNamesSkippedFrames(t *testing.T) {
	s := startServer(t, true, func(sc *serverConn) {
		sc.send([]byte(`{"t":"avatar","state":"thinking"}`))
		sc.send([]byte(`{"t":"typing"}`))
		sc.send(protocol.AppendMessage(nil, protocol.Message{ID: "m1", Text: "hi", Total: 1, Final: true}))
		sc.send(protocol.AppendError(nil, protocol.NewError(protocol.CodeBadFrame, "x")))
		sc.send([]byte(`{"t":"avatar","state":"idle"}`))
		sc.sendClose(ws.StatusGoingAway, "")
		_, _ = sc.readClose()
	})
	c := dial(t, s, Options{})
	ctx := testContext(t)
	f, err := c.Expect(ctx, "message")
	if err != nil || f.T() != "message" || f.Str("text") != "hi" {
		t.Fatalf(
			"Expect(message) = %v, %v",
			f, err,
		)
	}
	_, err = c.Expect(ctx, "ready")
	if err == nil {
		t.Fatalf(
			"Expect succeeded on a connection that closed",
		)
	}
	for _, want := range []string{`"ready"`, "skipped 2:", "error(bad_frame)", "avatar(idle)", "1001"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf(
				"error %q does not name %s",
				err, want,
			)
		}
	}
	if strings.Contains(err.Error(), "thinking") {
		t.Errorf(
			"error %q names a frame the first Expect consumed",
			err,
		)
	}
	if !errors.Is(err, io.EOF) {
		t.Errorf(
			"error %v does not wrap io.EOF",
			err,
		)
	}
}

func TestSendFragmented(t *testing.T) {
	type frameInfo struct {
		op     ws.OpCode
		fin    bool
		masked bool
	}
	type seenT struct {
		frames []frameInfo
		msg    protocol.ClientFrame
		after  protocol.ClientFrame
	}
	seen := make(chan result, 1)
	s := startServer(t, true, func(sc *serverConn) {
		var got seenT
		var msg []byte
		for {
			h, p, err := sc.readFrame()
			if err != nil {
				seen <- result{err: err}
				return
			}
			got.frames = append(got.frames, frameInfo{h.OpCode, h.Fin, h.Masked})
			msg = append(msg, p...)
			if h.Fin {
				break
			}
		}
		f, perr := protocol.Decode(msg)
		if perr != nil {
			seen <- result{err: perr}
			return
		}
		got.msg = f
		after, err := sc.decode()
		got.after = after
		seen <- result{v: got, err: err}
	})
	c := dial(t, s, Options{})

	// Pieces cut through the two-byte é and the three-byte ✓.
	msg := []byte(`{"t":"text","id":"f1","text":"héllo wörld ✓"}`)
	if err := c.SendFragmented(msg, 4); err != nil {
		t.Fatalf(
			"SendFragmented: %v",
			err,
		)
	}
	if err := c.Text("f2", "after"); err != nil {
		t.Fatalf(
			"Text: %v",
			err,
		)
	}
	got := await(t, seen).(seenT)
	want := []frameInfo{
		{ws.OpText, false, true},
		{ws.OpContinuation, false, true},
		{ws.OpContinuation, false, true},
		{ws.OpContinuation, true, true},
	}
	if !reflect.DeepEqual(got.frames, want) {
		t.Errorf(
			"frames on the wire %+v, want %+v",
			got.frames, want,
		)
	}
	if w := (&protocol.Text{ID: "f1", Text: "héllo wörld ✓"}); !reflect.DeepEqual(got.msg, w) {
		t.Errorf(
			"server reassembled %+v, want %+v",
			got.msg, w,
		)
	}
	if w := (&protocol.Text{ID: "f2", Text: "after"}); !reflect.DeepEqual(got.after, w) {
		t.Errorf(
			"message after the fragments %+v, want %+v",
			got.after, w,
		)
	}
}

func TestFragmentedMessageFromServer(t *testing.T) {
	pong := make(chan result, 1)
	s := startServer(t, true, func(sc *serverConn) {
		sc.sendFrame(ws.OpText, false, []byte(`{"t":"fr`))
		sc.sendFrame(ws.OpPing, true, []byte("in-between"))
		sc.sendFrame(ws.OpContinuation, true, []byte(`ag","n":7}`))
		h, p, err := sc.readFrame()
		if err == nil && h.OpCode != ws.OpPong {
			err = errors.New("no pong")
		}
		pong <- result{v: string(p), err: err}
	})
	c := dial(t, s, Options{})
	f, err := c.Next(testContext(t))
	if err != nil || f.T() != "frag" || f.Int("n") != 7 {
		t.Errorf(
			"got %v, %v; want the reassembled frag frame",
			f, err,
		)
	}
	if got := await(t, pong); got != "in-between" {
		t.Errorf(
			"pong payload %q, want the ping's",
			got,
		)
	}
}

func TestCollectMessage(t *testing.T) {
	s := startServer(t, true, func(sc *serverConn) {
		msg := func(m protocol.Message) { sc.send(protocol.AppendMessage(nil, m)) }
		sc.send(protocol.AppendAvatar(nil, protocol.AvatarThinking))
		msg(protocol.Message{ID: "m1", Text: "Hel", Index: 0, Total: 1})
		sc.send(protocol.AppendTyping(nil, false))
		msg(protocol.Message{ID: "m1", Text: "Hello, ", Index: 0, Total: 2, Edit: true})
		msg(protocol.Message{ID: "m2", Text: "other", Index: 0, Total: 1, Final: true})
		msg(protocol.Message{ID: "m1", Text: "world", Index: 1, Total: 2, Edit: true, Final: true})
		sc.send(protocol.AppendAvatar(nil, protocol.AvatarSpeaking))
		// A long answer in three chunks, then one with a chunk missing.
		msg(protocol.Message{ID: "m3", Text: "a", Index: 0, Total: 3})
		msg(protocol.Message{ID: "m3", Text: "b", Index: 1, Total: 3})
		msg(protocol.Message{ID: "m3", Text: "c", Index: 2, Total: 3, Final: true})
		msg(protocol.Message{ID: "m4", Text: "x", Index: 0, Total: 3})
		msg(protocol.Message{ID: "m4", Text: "z", Index: 2, Total: 3, Final: true})
		_, _ = sc.readClose()
	})
	c := dial(t, s, Options{})
	ctx := testContext(t)

	text, frames, err := c.CollectMessage(ctx, "m1")
	if err != nil || text != "Hello, world" || len(frames) != 3 {
		t.Fatalf(
			"CollectMessage(m1) = %q, %d frames, %v; want \"Hello, world\" from 3",
			text, len(frames), err,
		)
	}
	// The frames skipped meanwhile wait in the backlog, in order.
	if f, err := c.Expect(ctx, "avatar"); err != nil || f.Str("state") != "thinking" {
		t.Errorf(
			"first avatar %v, %v; want thinking",
			f, err,
		)
	}
	if text, _, err := c.CollectMessage(ctx, "m2"); err != nil || text != "other" {
		t.Errorf(
			"CollectMessage(m2) = %q, %v",
			text, err,
		)
	}
	if f, err := c.Next(ctx); err != nil || f.T() != "typing" {
		t.Errorf(
			"next %v, %v; want the typing frame left in the backlog",
			f, err,
		)
	}
	if f, err := c.Next(ctx); err != nil || f.Str("state") != "speaking" {
		t.Errorf(
			"next %v, %v; want avatar speaking",
			f, err,
		)
	}
	if text, frames, err := c.CollectMessage(ctx, "m3"); err != nil || text != "abc" || len(frames) != 3 {
		t.Errorf(
			"CollectMessage(m3) = %q, %d frames, %v; want abc",
			text, len(frames), err,
		)
	}
	_, _, err = c.CollectMessage(ctx, "m4")
	if err == nil || !strings.Contains(err.Error(), "chunk 2 arrived where 1 was due") {
		t.Errorf(
			"CollectMessage(m4) with a missing chunk: %v",
			err,
		)
	}
}

func TestCollectMedia(t *testing.T) {
	file := make([]byte, 10000)
	for i := range file {
		file[i] = byte(i * 7)
	}
	s := startServer(t, true, func(sc *serverConn) {
		chunk := func(id string, part int, data []byte) {
			sc.send(protocol.AppendMedia(nil, protocol.MediaChunk{
				ID: id, Kind: "image", Mime: "image/png", Filename: "cat.png", Caption: "a cat",
				Part: part, Parts: 3, Final: part == 2, Size: len(file), Data: data,
			}))
		}
		chunk("f1", 0, file[:4000])
		sc.send(protocol.AppendAvatar(nil, protocol.AvatarSpeaking))
		chunk("other", 0, file[:10])
		chunk("f1", 1, file[4000:8000])
		chunk("f1", 2, file[8000:])
		_, _ = sc.readClose()
	})
	c := dial(t, s, Options{})
	ctx := testContext(t)

	meta, data, err := c.CollectMedia(ctx, "f1")
	if err != nil {
		t.Fatalf(
			"CollectMedia: %v",
			err,
		)
	}
	if !bytes.Equal(data, file) {
		t.Errorf(
			"assembled %d bytes, want the %d of the file",
			len(data), len(file),
		)
	}
	if meta.Str("kind") != "image" || meta.Str("mime") != "image/png" || meta.Str("filename") != "cat.png" ||
		meta.Str("caption") != "a cat" || meta.Int("size") != len(file) || meta.Int("part") != 0 {
		t.Errorf(
			"meta %v",
			meta,
		)
	}
	if f, err := c.Expect(ctx, "avatar"); err != nil || f.Str("state") != "speaking" {
		t.Errorf(
			"avatar kept in the backlog: %v, %v",
			f, err,
		)
	}
	if f, err := c.Next(ctx); err != nil || f.T() != "media" || f.Str("id") != "other" {
		t.Errorf(
			"next %v, %v; want the other file's chunk",
			f, err,
		)
	}
}

func TestLocalAddrAndHeader(t *testing.T) {
	s := startServer(t, true, func(sc *serverConn) {
		host, _, _ := net.SplitHostPort(sc.RemoteAddr().String())
		sc.send([]byte(`{"t":"whoami","addr":"` + host + `","xff":"` + sc.header.Get("X-Forwarded-For") + `"}`))
		_, _ = sc.readClose()
	})
	c := dial(t, s, Options{
		LocalAddr: netip.MustParseAddr("127.0.0.7"),
		Header:    http.Header{"X-Forwarded-For": {"203.0.113.9"}},
	})
	f, err := c.Expect(testContext(t), "whoami")
	if err != nil {
		t.Fatalf(
			"expect whoami: %v",
			err,
		)
	}
	if got := f.Str("addr"); got != "127.0.0.7" {
		t.Errorf(
			"server saw the client at %s, want 127.0.0.7",
			got,
		)
	}
	if got := f.Str("xff"); got != "203.0.113.9" {
		t.Errorf(
			"server saw X-Forwarded-For %q",
			got,
		)
	}
	if ip := c.LocalAddr().(*net.TCPAddr).IP.String(); ip != "127.0.0.7" {
		t.Errorf(
			"LocalAddr %s",
			ip,
		)
	}
}

func TestHandshakeRefused(t *testing.T) {
	s := startServer(t, false, func(sc *serverConn) {
		buf := make([]byte, 4096)
		_, _ = sc.Read(buf)
		_, _ = io.WriteString(sc, "HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\nX-Why: test\r\n\r\nnope!\n")
	})
	_, err := Dial(testContext(t), s.url, Options{Timeout: 5 * time.Second})
	var he *HandshakeError
	if !errors.As(err, &he) {
		t.Fatalf(
			"dial: %v, want a *HandshakeError",
			err,
		)
	}
	if he.Status != 403 || string(he.Body) != "nope!\n" || he.Header.Get("X-Why") != "test" {
		t.Errorf(
			"handshake error %+v",
			he,
		)
	}
	var se ws.StatusError
	if !errors.As(err, &se) || int(se) != 403 {
		t.Errorf(
			"%v does not unwrap to ws.StatusError 403",
			err,
		)
	}
}

func TestPingPong(t *testing.T) {
	seen := make(chan result, 2)
	s := startServer(t, true, func(sc *serverConn) {
		sc.sendFrame(ws.OpPing, true, []byte("hb"))
		h, p, err := sc.readFrame()
		if err == nil && (h.OpCode != ws.OpPong || !h.Masked) {
			err = errors.New("want a masked pong")
		}
		seen <- result{v: string(p), err: err}
		f, err := sc.decode()
		if err != nil {
			seen <- result{err: err}
			return
		}
		ping, _ := f.(*protocol.Ping)
		if ping == nil {
			seen <- result{err: errors.New("not a ping")}
			return
		}
		sc.send(protocol.AppendPong(nil, ping.TS))
		seen <- result{v: string(ping.TS)}
		_, _ = sc.readClose()
	})
	c := dial(t, s, Options{})
	if got := await(t, seen); got != "hb" {
		t.Errorf(
			"pong payload %q, want hb",
			got,
		)
	}
	if err := c.Ping(1720000000123); err != nil {
		t.Fatal(err)
	}
	if got := await(t, seen); got != "1720000000123" {
		t.Errorf(
			"server got ts %v",
			got,
		)
	}
	f, err := c.Expect(testContext(t), "pong")
	if err != nil || f.Int("ts") != 1720000000123 {
		t.Errorf(
			"pong %v, %v",
			f, err,
		)
	}
}

func TestTypedSenders(t *testing.T) {
	const want = 12
	got := make(chan result, want+1)
	s := startServer(t, true, func(sc *serverConn) {
		for range want {
			f, err := sc.decode()
			got <- result{v: f, err: err}
			if err != nil {
				return
			}
		}
		_, _ = sc.readClose()
	})
	c := dial(t, s, Options{})
	file := []byte("0123456789")
	sends := []struct {
		name string
		send func() error
		want []protocol.ClientFrame
	}{
		{
			name: "text",
			send: func() error { return c.Text("t1", "<b>hi</b> & bye") },
			want: []protocol.ClientFrame{&protocol.Text{ID: "t1", Text: "<b>hi</b> & bye"}},
		},
		{
			name: "audio",
			send: func() error { return c.Audio("a1", "ogg", []byte("OggS..."), "hello") },
			want: []protocol.ClientFrame{&protocol.Audio{ID: "a1", Format: "ogg", Data: []byte("OggS..."), Text: "hello"}},
		},
		{
			name: "media",
			send: func() error {
				return c.Media(MediaUp{ID: "p1", Kind: "document", Filename: "a.pdf", Data: []byte("%PDF")})
			},
			want: []protocol.ClientFrame{&protocol.MediaUp{
				ID: "p1", Kind: "document", Mime: "application/pdf", Filename: "a.pdf", Data: []byte("%PDF"), Part: 0, Parts: 1,
			}},
		},
		{
			name: "upload",
			send: func() error { return c.UploadFile("u1", "image", "image/png", "x.png", "cap", file, 4) },
			want: []protocol.ClientFrame{
				&protocol.MediaUp{ID: "u1", Kind: "image", Mime: "image/png", Filename: "x.png", Caption: "cap", Data: file[:4], Part: 0, Parts: 3},
				&protocol.MediaUp{ID: "u1", Kind: "image", Mime: "image/png", Filename: "x.png", Caption: "cap", Data: file[4:8], Part: 1, Parts: 3},
				&protocol.MediaUp{ID: "u1", Kind: "image", Mime: "image/png", Filename: "x.png", Caption: "cap", Data: file[8:], Part: 2, Parts: 3},
			},
		},
		{
			name: "answer",
			send: func() error { return c.Answer("pr1", "once", "") },
			want: []protocol.ClientFrame{&protocol.PromptAnswer{PromptID: "pr1", OptionID: "once"}},
		},
		{
			name: "answer text",
			send: func() error { return c.Answer("pr2", "", "my own") },
			want: []protocol.ClientFrame{&protocol.PromptAnswer{PromptID: "pr2", Text: "my own"}},
		},
		{
			name: "typing",
			send: c.Typing,
			want: []protocol.ClientFrame{&protocol.Typing{}},
		},
		{
			name: "ack",
			send: func() error { return c.Ack("m9") },
			want: []protocol.ClientFrame{&protocol.Ack{ID: "m9"}},
		},
		{
			name: "deliver",
			send: func() error {
				return c.Deliver("d1", "tel-2", "cron says hi", &DeliverMedia{Kind: "voice", Mime: "audio/ogg", Data: []byte{1, 2, 3}})
			},
			want: []protocol.ClientFrame{&protocol.Deliver{
				ID: "d1", Target: "tel-2", Text: "cron says hi",
				Media: &protocol.DeliverMedia{Kind: "voice", Mime: "audio/ogg", Data: []byte{1, 2, 3}},
			}},
		},
		{
			name: "ping without ts",
			send: func() error { return c.Ping(nil) },
			want: []protocol.ClientFrame{&protocol.Ping{}},
		},
	}
	n := 0
	for _, tc := range sends {
		if err := tc.send(); err != nil {
			t.Fatalf(
				"%s: %v",
				tc.name, err,
			)
		}
		for _, w := range tc.want {
			n++
			if g := await(t, got); !reflect.DeepEqual(g, w) {
				t.Errorf(
					"%s: server decoded %#v, want %#v",
					tc.name, g, w,
				)
			}
		}
	}
	if n != want {
		t.Fatalf(
			"test table has %d frames, the server script reads %d",
			n, want,
		)
	}
}

func TestSendRawAndBinary(t *testing.T) {
	type msg struct {
		op ws.OpCode
		p  []byte
	}
	got := make(chan result, 3)
	s := startServer(t, true, func(sc *serverConn) {
		for range 3 {
			p, op, err := wsutil.ReadClientData(sc)
			got <- result{v: msg{op, p}, err: err}
		}
	})
	c := dial(t, s, Options{})
	invalid := []byte("{\"t\":\"text\",\"id\":\"x\",\"text\":\"\xff\xfe\"}")
	broken := []byte(`{"t":"text",`)
	for _, p := range [][]byte{invalid, broken} {
		if err := c.SendRaw(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.SendBinary([]byte{0, 1, 2}); err != nil {
		t.Fatal(err)
	}
	// The server's wsutil reader checks UTF-8 of text messages: the invalid
	// sequence must arrive as it was sent, so the check fails.
	r := <-got
	if !errors.Is(r.err, wsutil.ErrInvalidUTF8) {
		t.Errorf(
			"invalid UTF-8 arrived as %v, %v",
			r.v, r.err,
		)
	}
	if g := await(t, got).(msg); g.op != ws.OpText || !bytes.Equal(g.p, broken) {
		t.Errorf(
			"broken JSON arrived as %v %q",
			g.op, g.p,
		)
	}
	if g := await(t, got).(msg); g.op != ws.OpBinary || !bytes.Equal(g.p, []byte{0, 1, 2}) {
		t.Errorf(
			"binary arrived as %v %q",
			g.op, g.p,
		)
	}
}

func TestHugeFrameWhileServerAnswersAndCloses(t *testing.T) {
	announced := make(chan result, 1)
	s := startServer(t, true, func(sc *serverConn) {
		h, err := ws.ReadHeader(sc)
		announced <- result{v: h.Length, err: err}
		if err != nil || h.Length <= protocol.MaxFrameBytes {
			return
		}
		// Like the gateway: answer at once, without reading the payload,
		// and drop the connection.
		sc.send(protocol.AppendError(nil, protocol.NewFatal(protocol.CodeTooBig, "frame is larger than 16 MiB")))
		sc.sendClose(protocol.CloseCode, string(protocol.CodeTooBig))
	})
	c := dial(t, s, Options{})
	ctx := testContext(t)

	big := bytes.Repeat([]byte("a"), protocol.MaxFrameBytes+1)
	sent := make(chan error, 1)
	go func() { sent <- c.SendRaw(big) }()

	if got := await(t, announced); got != int64(protocol.MaxFrameBytes+1) {
		t.Errorf(
			"server saw a frame of %v bytes",
			got,
		)
	}
	f, err := c.Expect(ctx, "error")
	if err != nil || f.Str("code") != "too_big" || !f.Bool("fatal") {
		t.Fatalf(
			"expect error: %v, %v",
			f, err,
		)
	}
	ci, err := c.ExpectClose(ctx)
	if err != nil || ci.Code != 1008 || ci.Reason != "too_big" {
		t.Errorf(
			"close %v, %v; want 1008 too_big",
			ci, err,
		)
	}
	select {
	case err := <-sent:
		// The server dropped the connection in the middle of the frame.
		if err == nil {
			t.Logf("SendRaw completed")
		}
	case <-ctx.Done():
		t.Fatalf(
			"SendRaw still blocked after the server closed",
		)
	}
	if bytes.Count(big, []byte("a")) != len(big) {
		t.Errorf(
			"SendRaw modified the caller's bytes while masking",
		)
	}
}

func TestSendHeaderOnly(t *testing.T) {
	type seenT struct {
		length int64
		fin    bool
		p      string
		after  protocol.ClientFrame
	}
	seen := make(chan result, 1)
	s := startServer(t, true, func(sc *serverConn) {
		h, p, err := sc.readFrame()
		if err != nil {
			seen <- result{err: err}
			return
		}
		after, err := sc.decode()
		seen <- result{v: seenT{h.Length, h.Fin, string(p), after}, err: err}
	})
	c := dial(t, s, Options{})
	if err := c.SendHeaderOnly(10); err != nil {
		t.Fatal(err)
	}
	if err := c.Text("x", "in the middle"); !errors.Is(err, errPartialFrame) {
		t.Errorf(
			"Text inside an incomplete frame: %v",
			err,
		)
	}
	for _, p := range []string{"01234", "567", "89"} {
		if err := c.SendPayload([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.SendPayload([]byte("!")); err == nil {
		t.Errorf(
			"SendPayload beyond the announced length succeeded",
		)
	}
	if err := c.Text("t2", "after"); err != nil {
		t.Fatal(err)
	}
	got := await(t, seen).(seenT)
	want := seenT{10, true, "0123456789", &protocol.Text{ID: "t2", Text: "after"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf(
			"server saw %+v, want %+v",
			got, want,
		)
	}
}

func TestCloseNow(t *testing.T) {
	seen := make(chan result, 1)
	s := startServer(t, true, func(sc *serverConn) {
		_, err := sc.readMessage()
		var closed wsutil.ClosedError
		if errors.As(err, &closed) {
			seen <- result{err: errors.New("client sent a close frame")}
			return
		}
		seen <- result{v: err}
	})
	c := dial(t, s, Options{})
	if err := c.CloseNow(); err != nil {
		t.Errorf(
			"CloseNow: %v",
			err,
		)
	}
	if got := await(t, seen); !errors.Is(got.(error), io.EOF) {
		t.Errorf(
			"server read %v, want EOF",
			got,
		)
	}
	if _, err := c.Next(testContext(t)); !errors.Is(err, io.EOF) {
		t.Errorf(
			"Next after CloseNow: %v",
			err,
		)
	}
	if err := c.SendRaw([]byte("{}")); !errors.Is(err, ErrClosed) {
		t.Errorf(
			"SendRaw after CloseNow: %v",
			err,
		)
	}
}

func TestMalformedServerFrames(t *testing.T) {
	s := startServer(t, true, func(sc *serverConn) {
		sc.send([]byte(`{"t":"x"`))
		sc.send([]byte(`[1,2]`))
		sc.send([]byte("{\"t\":\"a\xff\"}"))
		sc.send([]byte(`{"t":"ok"} {}`))
		sc.sendFrame(ws.OpBinary, true, []byte(`{"t":"bin"}`))
		sc.send([]byte(`{"t":"ok"}`))
		_, _ = sc.readClose()
	})
	c := dial(t, s, Options{})
	ctx := testContext(t)
	for _, want := range []string{`{"t":"x"`, `[1,2]`, "{\"t\":\"a\xff\"}", `{"t":"ok"} {}`, `{"t":"bin"}`} {
		f, err := c.Next(ctx)
		if err == nil || string(f.Raw()) != want || f.Err() != err {
			t.Errorf(
				"Next = %q, %v; want %q with an error",
				f.Raw(), err, want,
			)
		}
	}
	if f, err := c.Next(ctx); err != nil || f.T() != "ok" {
		t.Errorf(
			"well-formed frame after the bad ones: %v, %v",
			f, err,
		)
	}
}

func TestReadLimit(t *testing.T) {
	seen := make(chan result, 1)
	s := startServer(t, true, func(sc *serverConn) {
		sc.send([]byte(`{"t":"small"}`))
		sc.send([]byte(`{"t":"big","pad":"` + strings.Repeat("x", 200) + `"}`))
		code, err := sc.readClose()
		seen <- result{v: code, err: err}
	})
	c := dial(t, s, Options{ReadLimit: 100})
	ctx := testContext(t)
	if f, err := c.Next(ctx); err != nil || f.T() != "small" {
		t.Fatalf(
			"small frame: %v, %v",
			f, err,
		)
	}
	if f, err := c.Next(ctx); !errors.Is(err, io.EOF) || !errors.Is(err, wsutil.ErrFrameTooLarge) {
		t.Errorf(
			"Next past the limit: %v, %v; want the connection to end",
			f, err,
		)
	}
	if got := await(t, seen); got != ws.StatusMessageTooBig {
		t.Errorf(
			"client closed with %v, want 1009",
			got,
		)
	}
}

func TestFrameGetters(t *testing.T) {
	f := decodeFrame(ws.OpText, []byte(`{"t":"media","part":2,"size":8388608,"f":1.5,"final":true,"chunk":{"index":3},"list":[1,"a"]}`))
	if f.T() != "media" || f.Int("part") != 2 || f.Int("size") != protocol.MaxMediaBytes || f.Float("f") != 1.5 ||
		!f.Bool("final") || f.Map("chunk").Int("index") != 3 || len(f.Slice("list")) != 2 {
		t.Errorf(
			"getters on %v",
			f,
		)
	}
	if f.Str("part") != "" || f.Int("missing") != 0 || !f.Map("t").IsZero() || f.Bool("t") || f.Has("missing") || !f.Has("size") {
		t.Errorf(
			"getters of absent or mistyped members on %v",
			f,
		)
	}
	b, err := f.MarshalJSON()
	if err != nil || !bytes.Contains(b, []byte(`"size":8388608`)) {
		t.Errorf(
			"MarshalJSON = %s, %v",
			b, err,
		)
	}
	if got := AsServerError(f); got != nil {
		t.Errorf(
			"AsServerError of a media frame: %v",
			got,
		)
	}
}

func TestHugeFrameToServerThatStopsReading(t *testing.T) {
	release := make(chan struct{})
	s := startServer(t, true, func(sc *serverConn) {
		if _, err := ws.ReadHeader(sc); err != nil {
			return
		}
		// Answer and close the WebSocket, but neither read the payload nor
		// drop TCP: only the client can end this.
		sc.send(protocol.AppendError(nil, protocol.NewFatal(protocol.CodeTooBig, "frame is larger than 16 MiB")))
		sc.sendClose(protocol.CloseCode, string(protocol.CodeTooBig))
		<-release
	})
	defer close(release)
	c := dial(t, s, Options{})
	ctx := testContext(t)

	sent := make(chan error, 1)
	go func() { sent <- c.SendRaw(make([]byte, protocol.MaxFrameBytes+1)) }()
	if f, err := c.Expect(ctx, "error"); err != nil || f.Str("code") != "too_big" {
		t.Fatalf(
			"expect error: %v, %v",
			f, err,
		)
	}
	if ci, err := c.ExpectClose(ctx); err != nil || ci.Code != 1008 {
		t.Fatalf(
			"expect close: %v, %v",
			ci, err,
		)
	}
	select {
	case err := <-sent:
		if !errors.Is(err, ErrClosed) {
			t.Errorf(
				"SendRaw: %v, want ErrClosed once the client gave up on the server",
				err,
			)
		}
	case <-time.After(3 * closeWait):
		t.Fatalf(
			"SendRaw still blocked %v after the server's close",
			3*closeWait,
		)
	}
	select {
	case <-c.Done():
	case <-time.After(closeWait):
		t.Errorf(
			"reader still running",
		)
	}
}

func TestConcurrentSendersAndPings(t *testing.T) {
	const (
		senders = 8
		each    = 50
		pings   = 100
	)
	type counts struct{ texts, pongs int }
	seen := make(chan result, 1)
	s := startServer(t, true, func(sc *serverConn) {
		go func() {
			for i := range pings {
				if err := ws.WriteFrame(sc, ws.NewPingFrame([]byte(fmt.Sprint("p", i)))); err != nil {
					return
				}
				time.Sleep(100 * time.Microsecond) // the server's ping pace
			}
		}()
		rd := wsutil.NewServerSideReader(sc)
		var n counts
		for n.texts < senders*each || n.pongs < pings {
			h, err := rd.NextFrame()
			if err != nil {
				seen <- result{v: n, err: err}
				return
			}
			p, err := io.ReadAll(rd)
			if err != nil {
				seen <- result{v: n, err: err}
				return
			}
			switch h.OpCode {
			case ws.OpPong:
				n.pongs++
			case ws.OpText:
				if f, perr := protocol.Decode(p); perr != nil || f.Type() != "text" {
					seen <- result{err: fmt.Errorf("message %d: %q: %v", n.texts, p, perr)}
					return
				}
				n.texts++
			}
		}
		seen <- result{v: n}
	})
	c := dial(t, s, Options{})
	var wg sync.WaitGroup
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := c.Text(fmt.Sprint(g, "-", i), strings.Repeat("x", 1+1000*(i%5))); err != nil {
					t.Errorf(
						"sender %d: %v",
						g, err,
					)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := await(t, seen).(counts); got != (counts{senders * each, pings}) {
		t.Errorf(
			"server counted %+v",
			got,
		)
	}
}

func TestOneGoroutinePerConn(t *testing.T) {
	s := startServer(t, true, func(sc *serverConn) { _, _ = sc.readClose() })
	ours := func() int {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		n := 0
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "gateway/pkg/client.") && !strings.Contains(g, "_test.go") {
				n++
			}
		}
		return n
	}
	settle := func() {
		// A closed Conn's reader has closed Done but may still be on its way
		// out of the function.
		testsvc.Eventually(2*time.Second, func() bool { return ours() == 0 })
	}
	settle() // the Conns of earlier tests are all closed
	before := ours()
	conns := make([]*Conn, 3)
	for i := range conns {
		conns[i] = dial(t, s, Options{Timeout: time.Second})
	}
	if got := ours() - before; got != len(conns) {
		t.Errorf(
			"%d goroutines of package client for %d connections",
			got, len(conns),
		)
	}
	for _, c := range conns {
		_ = c.Close()
	}
	settle()
	if got := ours() - before; got != 0 {
		t.Errorf(
			"%d goroutines left after Close",
			got,
		)
	}
}
