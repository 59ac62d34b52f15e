package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strings"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// MediaUp is one chunk of one file from the app (a media frame).
type MediaUp = protocol.MediaUp

// DeliverMedia is the attachment of a deliver frame.
type DeliverMedia = protocol.DeliverMedia

type helloFrame struct {
	T      string           `json:"t"`
	Token  string           `json:"token"`
	Device *protocol.Device `json:"device,omitempty"`
	User   *protocol.User   `json:"user,omitempty"`
}

type textFrame struct {
	T    string `json:"t"`
	ID   string `json:"id"`
	Text string `json:"text"`
}

type audioFrame struct {
	T      string `json:"t"`
	ID     string `json:"id"`
	Format string `json:"format"`
	Data   string `json:"data"`
	Text   string `json:"text,omitempty"`
}

type mediaFrame struct {
	T        string `json:"t"`
	ID       string `json:"id"`
	Kind     string `json:"kind"`
	Mime     string `json:"mime,omitempty"`
	Filename string `json:"filename,omitempty"`
	Caption  string `json:"caption,omitempty"`
	Data     string `json:"data"`
	Part     *int   `json:"part,omitempty"`
	Parts    *int   `json:"parts,omitempty"`
}

type answerFrame struct {
	T        string `json:"t"`
	PromptID string `json:"prompt_id"`
	OptionID string `json:"option_id,omitempty"`
	Text     string `json:"text,omitempty"`
}

type pingFrame struct {
	T  string `json:"t"`
	TS any    `json:"ts,omitempty"`
}

type ackFrame struct {
	T  string `json:"t"`
	ID string `json:"id"`
}

type deliverFrame struct {
	T      string           `json:"t"`
	ID     string           `json:"id,omitempty"`
	Target string           `json:"target,omitempty"`
	Text   string           `json:"text,omitempty"`
	Media  *deliverMediaObj `json:"media,omitempty"`
}

type deliverMediaObj struct {
	Kind     string `json:"kind"`
	Mime     string `json:"mime,omitempty"`
	Filename string `json:"filename,omitempty"`
	Data     string `json:"data"`
}

func b64(p []byte) string { return base64.StdEncoding.EncodeToString(p) }

// Hello sends hello and waits for the answer: the ready frame, or an error
// frame, returned as a *ServerError. A zero dev or user is left out of the
// frame. Frames of other types before the answer are consumed.
func (c *Conn) Hello(ctx context.Context, token string, dev protocol.Device, user protocol.User) (Frame, error) {
	h := helloFrame{T: protocol.TypeHello, Token: token}
	if dev != (protocol.Device{}) {
		h.Device = &dev
	}
	if user != (protocol.User{}) {
		h.User = &user
	}
	if err := c.Send(h); err != nil {
		return Frame{}, err
	}
	if err := c.acquire(ctx); err != nil {
		return Frame{}, err
	}
	defer c.release()
	var skipped []Frame
	for {
		f, err := c.next(ctx)
		if err != nil {
			return Frame{}, fmt.Errorf("client: waiting for ready%s: %w", skippedList(skipped), err)
		}
		if ci := f.Close(); ci != nil {
			return Frame{}, fmt.Errorf("client: waiting for ready%s: server closed the connection (%s): %w",
				skippedList(skipped), ci, io.EOF)
		}
		switch f.T() {
		case protocol.TypeReady:
			return f, nil
		case protocol.TypeError:
			return Frame{}, AsServerError(f)
		}
		skipped = append(skipped, f)
	}
}

// Text sends a text frame.
func (c *Conn) Text(id, text string) error {
	return c.Send(textFrame{T: protocol.TypeText, ID: id, Text: text})
}

// Audio sends an audio frame; data is sent in base64, text (the recognised
// text) is left out when empty.
func (c *Conn) Audio(id, format string, data []byte, text string) error {
	return c.Send(audioFrame{T: protocol.TypeAudio, ID: id, Format: format, Data: b64(data), Text: text})
}

// Media sends one media frame. Empty Mime, Filename and Caption are left out;
// part and parts are left out when Parts is 0 (the server then assumes one
// part).
func (c *Conn) Media(m MediaUp) error {
	f := mediaFrame{
		T:        protocol.TypeMedia,
		ID:       m.ID,
		Kind:     m.Kind,
		Mime:     m.Mime,
		Filename: m.Filename,
		Caption:  m.Caption,
		Data:     b64(m.Data),
	}
	if m.Parts != 0 {
		f.Part, f.Parts = &m.Part, &m.Parts
	}
	return c.Send(f)
}

// UploadFile sends data as media frames of at most chunkSize bytes each (0
// means protocol.MediaChunkBytes), with part and parts set and the same id,
// kind, mime, filename and caption on every part. Empty data is one part.
func (c *Conn) UploadFile(id, kind, mime, filename, caption string, data []byte, chunkSize int) error {
	if chunkSize <= 0 {
		chunkSize = protocol.MediaChunkBytes
	}
	parts := max(1, (len(data)+chunkSize-1)/chunkSize)
	for part := range parts {
		chunk := data[part*chunkSize : min(len(data), (part+1)*chunkSize)]
		err := c.Media(MediaUp{
			ID:       id,
			Kind:     kind,
			Mime:     mime,
			Filename: filename,
			Caption:  caption,
			Data:     chunk,
			Part:     part,
			Parts:    parts,
		})
		if err != nil {
			return fmt.Errorf("client: upload %q part %d of %d: %w", id, part, parts, err)
		}
	}
	return nil
}

// Answer sends a prompt frame, the response to a card; empty optionID and
// text are left out.
func (c *Conn) Answer(promptID, optionID, text string) error {
	return c.Send(answerFrame{T: protocol.TypePrompt, PromptID: promptID, OptionID: optionID, Text: text})
}

// Ping sends a protocol ping (not a WebSocket ping); the server answers with
// a pong carrying the same ts. A nil ts is left out.
func (c *Conn) Ping(ts any) error {
	return c.Send(pingFrame{T: protocol.TypePing, TS: ts})
}

// Typing sends a typing frame.
func (c *Conn) Typing() error {
	return c.Send(map[string]string{"t": protocol.TypeTyping})
}

// Ack sends an ack frame.
func (c *Conn) Ack(id string) error {
	return c.Send(ackFrame{T: protocol.TypeAck, ID: id})
}

// Deliver sends a deliver frame (service delivery). Empty id, target and text
// and a nil media are left out.
func (c *Conn) Deliver(id, target, text string, media *DeliverMedia) error {
	f := deliverFrame{T: protocol.TypeDeliver, ID: id, Target: target, Text: text}
	if media != nil {
		f.Media = &deliverMediaObj{Kind: media.Kind, Mime: media.Mime, Filename: media.Filename, Data: b64(media.Data)}
	}
	return c.Send(f)
}

// collect takes out of the stream, in order, the frames match accepts and
// passes them to add until add reports it is done; every other frame stays,
// in order, in the backlog. The error of a ctx end or a closed connection
// names the frames left in the backlog meanwhile.
func (c *Conn) collect(ctx context.Context, what string, match func(Frame) bool, add func(Frame) (bool, error)) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	for i := 0; i < len(c.pending); {
		f := c.pending[i]
		if !match(f) {
			i++
			continue
		}
		c.pending = append(c.pending[:i], c.pending[i+1:]...)
		if done, err := add(f); done || err != nil {
			return err
		}
	}
	before := len(c.pending)
	for {
		f, ok, err := c.recv(ctx)
		if err == nil && !ok {
			err = c.endErr
		}
		if err != nil {
			return fmt.Errorf("client: collecting %s%s: %w", what, skippedList(c.pending[before:]), err)
		}
		if !match(f) {
			c.pending = append(c.pending, f)
			continue
		}
		if done, err := add(f); done || err != nil {
			return err
		}
	}
}

// CollectMessage reassembles the agent message id from its message frames
// and returns its text and the frames, in order. An edit (edit: true) whose
// chunk.index is 0 starts the text anew; every chunk is appended; the frame
// with final: true completes the message. A chunk out of order is an error.
// Frames of other messages and of other types stay in the backlog.
func (c *Conn) CollectMessage(ctx context.Context, id string) (string, []Frame, error) {
	var (
		text   strings.Builder
		frames []Frame
		want   int
	)
	err := c.collect(ctx, fmt.Sprintf("message %q", id),
		func(f Frame) bool { return f.T() == protocol.TypeMessage && f.Str("id") == id },
		func(f Frame) (bool, error) {
			frames = append(frames, f)
			chunk := f.Map("chunk")
			index, total := chunk.Int("index"), chunk.Int("total")
			if f.Bool("edit") && index == 0 {
				text.Reset()
				want = 0
			}
			if index != want {
				return false, fmt.Errorf("client: message %q: chunk %d arrived where %d was due: %s", id, index, want, f)
			}
			if chunk.Has("total") && index >= total {
				return false, fmt.Errorf("client: message %q: chunk %d of %d: %s", id, index, total, f)
			}
			text.WriteString(f.Str("text"))
			want++
			return f.Bool("final"), nil
		})
	if err != nil {
		return text.String(), frames, err
	}
	return text.String(), frames, nil
}

// CollectMedia reassembles the file id from its media frames: meta is the
// first chunk (kind, mime, filename, caption, size, url, ...), data the
// decoded chunks in order (nil when the file came by url only). Parts must
// arrive in order, agree on parts, and end with final on the last one, whose
// total must match size. Other frames stay in the backlog.
func (c *Conn) CollectMedia(ctx context.Context, id string) (Frame, []byte, error) {
	var (
		meta    Frame
		data    bytes.Buffer
		hasData bool
		want    int
	)
	err := c.collect(ctx, fmt.Sprintf("media %q", id),
		func(f Frame) bool { return f.T() == protocol.TypeMedia && f.Str("id") == id },
		func(f Frame) (bool, error) {
			part, parts := f.Int("part"), f.Int("parts")
			if meta.IsZero() {
				meta = f
			}
			if part != want {
				return false, fmt.Errorf("client: media %q: part %d arrived where %d was due", id, part, want)
			}
			if parts != meta.Int("parts") || part >= parts {
				return false, fmt.Errorf("client: media %q: part %d of %d, the first part said %d parts", id, part, parts, meta.Int("parts"))
			}
			if f.Has("data") {
				b, err := base64.StdEncoding.DecodeString(f.Str("data"))
				if err != nil {
					return false, fmt.Errorf("client: media %q part %d: data is not base64: %w", id, part, err)
				}
				data.Write(b)
				hasData = true
			}
			want++
			if !f.Bool("final") {
				return false, nil
			}
			if part != parts-1 {
				return false, fmt.Errorf("client: media %q: final on part %d of %d", id, part, parts)
			}
			if hasData && data.Len() != f.Int("size") {
				return false, fmt.Errorf("client: media %q: %d bytes arrived, size says %d", id, data.Len(), f.Int("size"))
			}
			return true, nil
		})
	if !hasData {
		return meta, nil, err
	}
	return meta, data.Bytes(), err
}
