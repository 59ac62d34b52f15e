package protocol

import (
	"encoding/base64"
	"strconv"
	"unicode/utf8"
)

// Server frames are appended to a caller-owned buffer: no reflection and, when
// the buffer has room, no allocation. Each Append function writes exactly one
// JSON object.

// Capabilities is the capabilities object of ready; the gateway always
// declares the full set.
const capabilities = `{"text":true,"voice":true,"typing":true,` +
	`"avatar_states":["idle","thinking","speaking"],` +
	`"media_in":["image","video","document","audio"],` +
	`"media_out":["image","voice","video","document","animation"],` +
	`"prompts":["exec_approval","slash_confirm","clarify"],` +
	`"edit":true,"max_media_bytes":8388608,"max_text_chars":12000}`

// Ready is the server's answer to hello.
type Ready struct {
	Session    string
	DeviceID   string
	DeviceName string
	AvatarURL  string
	// Push are the kinds of push token the app may register with a push
	// frame (capabilities.push, omitted when none): the gateway's
	// extension.
	Push []string
}

// AppendReady appends a ready frame.
func AppendReady(b []byte, r Ready) []byte {
	b = append(b, `{"t":"ready","v":`...)
	b = strconv.AppendInt(b, Version, 10)
	b = append(b, `,"session":`...)
	b = AppendString(b, r.Session)
	b = append(b, `,"device":{"id":`...)
	b = AppendString(b, r.DeviceID)
	b = append(b, `,"name":`...)
	b = AppendString(b, r.DeviceName)
	b = append(b, `},"avatar_url":`...)
	b = AppendString(b, r.AvatarURL)
	b = append(b, `,"capabilities":`...)
	b = append(b, capabilities[:len(capabilities)-1]...)
	if len(r.Push) > 0 {
		b = append(b, `,"push":[`...)
		for i, k := range r.Push {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendString(b, k)
		}
		b = append(b, ']')
	}
	return append(b, "}}"...)
}

// AppendPush appends the answer to a push frame that was done: kind's
// token registered, or (registered false) taken back.
func AppendPush(b []byte, kind string, registered bool) []byte {
	b = append(b, `{"t":"push","kind":`...)
	b = AppendString(b, kind)
	b = append(b, `,"registered":`...)
	b = strconv.AppendBool(b, registered)
	return append(b, '}')
}

// Message is one message frame: one chunk of an agent message or of an edit.
type Message struct {
	ID    string
	Text  string
	Index int
	Total int
	Final bool
	Edit  bool
}

// AppendMessage appends a message frame.
func AppendMessage(b []byte, m Message) []byte {
	b = append(b, `{"t":"message","id":`...)
	b = AppendString(b, m.ID)
	b = append(b, `,"text":`...)
	b = AppendString(b, m.Text)
	b = append(b, `,"chunk":{"index":`...)
	b = strconv.AppendInt(b, int64(m.Index), 10)
	b = append(b, `,"total":`...)
	b = strconv.AppendInt(b, int64(m.Total), 10)
	b = append(b, `},"final":`...)
	b = strconv.AppendBool(b, m.Final)
	if m.Edit {
		b = append(b, `,"edit":true`...)
	}
	return append(b, '}')
}

// MediaChunk is one media frame to the app: one chunk of one file.
type MediaChunk struct {
	ID       string
	Kind     string
	Mime     string
	Filename string
	Caption  string
	Part     int
	Parts    int
	Final    bool
	Size     int    // the whole file, not the chunk
	Data     []byte // sent as base64; omitted when empty
	URL      string
	ReplyTo  string
}

// AppendMedia appends a media frame.
func AppendMedia(b []byte, m MediaChunk) []byte {
	b = append(b, `{"t":"media","id":`...)
	b = AppendString(b, m.ID)
	b = append(b, `,"kind":`...)
	b = AppendString(b, m.Kind)
	b = append(b, `,"mime":`...)
	b = AppendString(b, m.Mime)
	b = append(b, `,"filename":`...)
	b = AppendString(b, m.Filename)
	if m.Caption != "" {
		b = append(b, `,"caption":`...)
		b = AppendString(b, m.Caption)
	}
	b = append(b, `,"part":`...)
	b = strconv.AppendInt(b, int64(m.Part), 10)
	b = append(b, `,"parts":`...)
	b = strconv.AppendInt(b, int64(m.Parts), 10)
	b = append(b, `,"final":`...)
	b = strconv.AppendBool(b, m.Final)
	b = append(b, `,"size":`...)
	b = strconv.AppendInt(b, int64(m.Size), 10)
	if len(m.Data) > 0 {
		b = append(b, `,"data":"`...)
		b = base64.StdEncoding.AppendEncode(b, m.Data)
		b = append(b, '"')
	}
	if m.URL != "" {
		b = append(b, `,"url":`...)
		b = AppendString(b, m.URL)
	}
	if m.ReplyTo != "" {
		b = append(b, `,"reply_to":`...)
		b = AppendString(b, m.ReplyTo)
	}
	return append(b, '}')
}

// MediaFrameSize is an upper bound of the encoded size of m, for sizing buffers.
func MediaFrameSize(m MediaChunk) int {
	return 256 + base64.StdEncoding.EncodedLen(len(m.Data)) +
		6*(len(m.ID)+len(m.Kind)+len(m.Mime)+len(m.Filename)+len(m.Caption)+len(m.URL)+len(m.ReplyTo))
}

// AppendPrompt appends a prompt card.
func AppendPrompt(b []byte, p Prompt) []byte {
	b = append(b, `{"t":"prompt","id":`...)
	b = AppendString(b, p.ID)
	b = append(b, `,"kind":`...)
	b = AppendString(b, p.Kind)
	b = append(b, `,"text":`...)
	b = AppendString(b, p.Text)
	b = append(b, `,"options":[`...)
	for i, o := range p.Options {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = AppendString(b, o.ID)
		b = append(b, `,"label":`...)
		b = AppendString(b, o.Label)
		b = append(b, `,"style":`...)
		b = AppendString(b, o.Style)
		b = append(b, '}')
	}
	b = append(b, ']')
	if p.Command != "" {
		b = append(b, `,"command":`...)
		b = AppendString(b, p.Command)
	}
	if p.Description != "" {
		b = append(b, `,"description":`...)
		b = AppendString(b, p.Description)
	}
	b = append(b, `,"session":`...)
	b = AppendString(b, p.Session)
	b = append(b, `,"timeout_seconds":`...)
	b = strconv.AppendInt(b, int64(p.TimeoutSeconds), 10)
	return append(b, '}')
}

// PromptDone closes a card.
type PromptDone struct {
	ID       string
	OptionID string // the option actually applied; omitted when empty
	Expired  bool
}

// AppendPromptDone appends a prompt_done frame.
func AppendPromptDone(b []byte, d PromptDone) []byte {
	b = append(b, `{"t":"prompt_done","id":`...)
	b = AppendString(b, d.ID)
	if d.OptionID != "" {
		b = append(b, `,"option_id":`...)
		b = AppendString(b, d.OptionID)
	}
	if d.Expired {
		b = append(b, `,"expired":true`...)
	}
	return append(b, '}')
}

// AppendAvatar appends an avatar frame; an unknown state is sent as idle.
func AppendAvatar(b []byte, state string) []byte {
	b = append(b, `{"t":"avatar","state":`...)
	b = AppendString(b, AvatarState(state))
	return append(b, '}')
}

// AppendTyping appends a typing frame; stop clears the indicator at once.
func AppendTyping(b []byte, stop bool) []byte {
	if stop {
		return append(b, `{"t":"typing","stop":true}`...)
	}
	return append(b, `{"t":"typing"}`...)
}

// AppendPong appends a pong echoing ts, the raw JSON value of ping.ts
// (omitted when the ping had none).
func AppendPong(b []byte, ts []byte) []byte {
	if len(ts) == 0 {
		return append(b, `{"t":"pong"}`...)
	}
	b = append(b, `{"t":"pong","ts":`...)
	b = append(b, ts...)
	return append(b, '}')
}

// AppendDelivered appends a delivered frame: the deliver id reached
// device. The spec declares it; a client that does not know it ignores it.
// queued (only for a deliver with a ttl) says it did not reach the device
// yet but is kept in its outbox for its next connection: the optional
// member "queued":true, absent otherwise.
func AppendDelivered(b []byte, id, device string, queued bool) []byte {
	b = append(b, `{"t":"delivered","id":`...)
	b = AppendString(b, id)
	b = append(b, `,"device":`...)
	b = AppendString(b, device)
	if queued {
		b = append(b, `,"queued":true`...)
	}
	return append(b, '}')
}

// AppendError appends an error frame.
func AppendError(b []byte, e *Error) []byte {
	b = append(b, `{"t":"error","code":`...)
	b = AppendString(b, string(e.Code))
	b = append(b, `,"message":`...)
	b = AppendString(b, e.Message)
	b = append(b, `,"fatal":`...)
	b = strconv.AppendBool(b, e.Fatal)
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string. Invalid UTF-8 is replaced with
// U+FFFD; U+2028 and U+2029 are escaped so the output is also valid JavaScript.
func AppendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// SplitText cuts text into pieces of at most limit code points; an empty
// text is one empty piece, so every message has at least one frame.
func SplitText(text string, limit int) []string {
	if limit <= 0 {
		limit = DefaultChunkLimit
	}
	if len(text) <= limit {
		return []string{text}
	}
	var parts []string
	n, start := 0, 0
	for pos := range text {
		if n == limit {
			parts = append(parts, text[start:pos])
			start, n = pos, 0
		}
		n++
	}
	return append(parts, text[start:])
}
