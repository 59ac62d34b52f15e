package main

// What the side-by-side (sidebyside.go) needs of Centrifugo: a connection
// JWT signed with its HMAC secret, a WebSocket client of its JSON protocol
// (connect, subscribe, publications, the server's pings) and its HTTP API's
// publish and batch. Written against Centrifugo v6.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// hs256 is a JWT of claims signed with HMAC-SHA256 under secret (RFC 7519),
// what Centrifugo's client.token.hmac_secret_key verifies.
func hs256(secret string, claims map[string]any) string {
	enc := base64.RawURLEncoding
	header := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	body, _ := json.Marshal(claims) // a map of strings and numbers always encodes
	unsigned := header + "." + enc.EncodeToString(body)
	return unsigned + "." + hs256Signature(secret, unsigned)
}

// hs256Signature is the JWS signature of header.claims under secret.
func hs256Signature(secret, unsigned string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(unsigned))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// centrifugoConn is one client connection subscribed to one channel.
type centrifugoConn struct {
	conn    net.Conn
	br      *bufio.Reader
	wmu     sync.Mutex
	closing bool
}

// centrifugoReply is a reply to a command, or a push when ID is 0.
type centrifugoReply struct {
	ID    uint32 `json:"id"`
	Error *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Push *struct {
		Channel string `json:"channel"`
		Pub     *struct {
			Data struct {
				Text string `json:"text"`
			} `json:"data"`
		} `json:"pub"`
	} `json:"push"`
}

// centrifugoError is an error reply of Centrifugo.
type centrifugoError struct{ Code int }

func (e *centrifugoError) Error() string { return fmt.Sprintf("centrifugo: error %d", e.Code) }

// dialCentrifugo connects to url from src, sends connect with token and
// subscribes to channel, each waiting for its reply.
func dialCentrifugo(ctx context.Context, url, token, channel string, src netip.Addr) (*centrifugoConn, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	nd := &net.Dialer{}
	if src.IsValid() {
		nd.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
	}
	d := ws.Dialer{Timeout: connectTimeout, NetDial: nd.DialContext}
	conn, br, _, err := d.Dial(ctx, url)
	if err != nil {
		return nil, err
	}
	if br == nil {
		br = bufio.NewReaderSize(conn, 4096)
	}
	c := &centrifugoConn{conn: conn, br: br}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline) // a failed deadline shows as a failed read
	cmds := []any{
		map[string]any{"id": 1, "connect": map[string]string{"token": token, "name": "loadtest"}},
		map[string]any{"id": 2, "subscribe": map[string]string{"channel": channel}},
	}
	for i, cmd := range cmds {
		b, _ := json.Marshal(cmd)
		if err := c.write(b); err != nil {
			conn.Close()
			return nil, err
		}
		if err := c.await(uint32(i + 1)); err != nil {
			conn.Close()
			return nil, err
		}
	}
	_ = conn.SetDeadline(time.Time{})
	return c, nil
}

// await reads until the reply to command id, answering pings.
func (c *centrifugoConn) await(id uint32) error {
	for {
		var got *centrifugoReply
		err := c.read(func(r *centrifugoReply) {
			if r.ID == id {
				got = r
			}
		})
		if err != nil {
			return err
		}
		if got != nil {
			if got.Error != nil {
				return &centrifugoError{Code: got.Error.Code}
			}
			return nil
		}
	}
}

// write sends one text frame.
func (c *centrifugoConn) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	return wsutil.WriteClientText(c.conn, b)
}

// lockedWriter writes to c's connection under its lock: the answers to
// control frames read by read.
type lockedWriter struct{ c *centrifugoConn }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.c.wmu.Lock()
	defer w.c.wmu.Unlock()
	return w.c.conn.Write(b)
}

// read reads one frame and hands each reply or push in it to each (the
// server joins several with newlines); an empty command is the server's
// ping, answered with an empty one.
func (c *centrifugoConn) read(each func(*centrifugoReply)) error {
	data, err := wsutil.ReadServerText(struct {
		io.Reader
		io.Writer
	}{c.br, lockedWriter{c}})
	if err != nil {
		return err
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if bytes.Equal(line, []byte("{}")) {
			if err := c.write([]byte("{}")); err != nil {
				return err
			}
			continue
		}
		var r centrifugoReply
		if err := json.Unmarshal(line, &r); err != nil {
			return err
		}
		each(&r)
	}
	return nil
}

// consume reads publications until the connection ends, handing each
// publication's text to onText.
func (c *centrifugoConn) consume(onText func(string), onEnd func()) {
	for {
		err := c.read(func(r *centrifugoReply) {
			if r.Push != nil && r.Push.Pub != nil {
				onText(r.Push.Pub.Data.Text)
			}
		})
		if err != nil {
			c.wmu.Lock()
			closing := c.closing
			c.wmu.Unlock()
			if !closing {
				onEnd()
			}
			return
		}
	}
}

// close sends a close frame and closes the connection.
func (c *centrifugoConn) close() {
	c.wmu.Lock()
	c.closing = true
	_ = c.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_ = ws.WriteFrame(c.conn, ws.MaskFrame(ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))))
	c.wmu.Unlock()
	c.conn.Close()
}

// centrifugoAPI posts to Centrifugo's HTTP API at base with key.
type centrifugoAPI struct {
	base, key string
	hc        *http.Client
}

// call posts body to method and decodes the answer into out; it returns
// "" or the kind of failure.
func (a *centrifugoAPI) call(ctx context.Context, method string, body any, out any) string {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+"/api/"+method, bytes.NewReader(b))
	if err != nil {
		return method + ":request"
	}
	req.Header.Set("X-API-Key", a.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		return method + ":request"
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("%s:%d", method, resp.StatusCode)
	}
	if err := json.Unmarshal(rb, out); err != nil {
		return method + ":bad_answer"
	}
	return ""
}

// apiError is the error member of an API answer.
type apiError struct {
	Code int `json:"code"`
}

// publish publishes text to channel; "" when Centrifugo accepted it.
func (a *centrifugoAPI) publish(ctx context.Context, channel, text string) string {
	var r struct {
		Error *apiError `json:"error"`
	}
	if kind := a.call(ctx, "publish", map[string]any{"channel": channel, "data": map[string]string{"text": text}}, &r); kind != "" {
		return kind
	}
	if r.Error != nil {
		return fmt.Sprintf("publish:error %d", r.Error.Code)
	}
	return ""
}

// batch publishes texts[i] to channels[i] in one POST /api/batch, the
// commands run in parallel; it returns per publication "" or the kind of
// failure.
func (a *centrifugoAPI) batch(ctx context.Context, channels, texts []string) []string {
	kinds := make([]string, len(channels))
	cmds := make([]any, len(channels))
	for i := range channels {
		cmds[i] = map[string]any{"publish": map[string]any{"channel": channels[i], "data": map[string]string{"text": texts[i]}}}
	}
	var r struct {
		Replies []struct {
			Error *apiError `json:"error"`
		} `json:"replies"`
	}
	kind := a.call(ctx, "batch", map[string]any{"commands": cmds, "parallel": true}, &r)
	if kind == "" && len(r.Replies) != len(channels) {
		kind = "batch:replies"
	}
	for i := range kinds {
		switch {
		case kind != "":
			kinds[i] = kind
		case r.Replies[i].Error != nil:
			kinds[i] = fmt.Sprintf("batch:error %d", r.Replies[i].Error.Code)
		}
	}
	return kinds
}
