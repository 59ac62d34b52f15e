package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"mime"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// wire is every member a client frame can carry. Members are matched by
// exact name; unknown members are ignored; a repeated member keeps the last
// value, as the reference implementation's JSON parser does.
type wire struct {
	T        string          `json:"t"`
	ID       string          `json:"id"`
	Token    string          `json:"token"`
	Device   *Device         `json:"device"`
	User     *User           `json:"user"`
	Text     string          `json:"text"`
	Format   string          `json:"format"`
	Data     []byte          `json:"data"`
	Kind     string          `json:"kind"`
	Mime     string          `json:"mime"`
	Filename string          `json:"filename"`
	Caption  string          `json:"caption"`
	Part     *int64          `json:"part"`
	Parts    *int64          `json:"parts"`
	PromptID string          `json:"prompt_id"`
	OptionID string          `json:"option_id"`
	TS       jsontext.Value  `json:"ts"`
	Target   string          `json:"target"`
	Media    *wireDeliverAtt `json:"media"`
	Wait     string          `json:"wait"`
	TTL      *float64        `json:"ttl"`
}

// wireDeliverAtt is a deliver frame's media: DeliverBody's.
type wireDeliverAtt = DeliverBodyMedia

var decodeOpts = json.JoinOptions(
	jsontext.AllowDuplicateNames(true),
	jsontext.AllowInvalidUTF8(false),
)

// Decode parses and validates one WebSocket message from the app.
//
// It returns (nil, nil) for a frame whose type is unknown: the server ignores
// it. Any other problem is an error that is a *Error (errors.As) with the
// code the specification names; none of them is fatal here (the caller
// decides, e.g. before hello). The returned frame does not alias msg.
func Decode(msg []byte) (ClientFrame, error) {
	f, e := decode(msg)
	if e != nil {
		return nil, e // never a nil *Error in a non-nil error
	}
	return f, nil
}

func decode(msg []byte) (ClientFrame, *Error) {
	if !utf8.Valid(msg) {
		return nil, NewError(CodeBadFrame, "frame is not valid UTF-8")
	}
	var w wire
	if err := json.Unmarshal(msg, &w, decodeOpts); err != nil {
		return nil, decodeError(msg, err)
	}
	switch strings.ToLower(w.T) {
	case TypeHello:
		return decodeHello(&w)
	case TypeText:
		return decodeText(&w)
	case TypeAudio:
		return decodeAudio(&w)
	case TypeMedia:
		return decodeMedia(&w)
	case TypePrompt:
		return decodePrompt(&w)
	case TypeTyping:
		return &Typing{}, nil
	case TypePing:
		if len(w.TS) > MaxPingTSBytes {
			return nil, NewError(CodeTooBig, fmt.Sprintf("ping ts is longer than %d bytes", MaxPingTSBytes))
		}
		return &Ping{TS: bytes.Clone(w.TS)}, nil
	case TypeAck:
		return &Ack{ID: Truncate(w.ID, MaxIDChars)}, nil
	case TypeDeliver:
		return decodeDeliver(&w)
	case TypePush:
		return decodePush(&w)
	case "":
		return nil, NewError(CodeBadFrame, "frame has no type (t)")
	}
	return nil, nil
}

// decodeError explains why msg did not decode into a frame. A frame of an
// unknown type is ignored even when its members would not fit ours.
func decodeError(msg []byte, err error) *Error {
	var head struct {
		T any `json:"t"`
	}
	if json.Unmarshal(msg, &head, decodeOpts) != nil {
		var syn *jsontext.SyntacticError
		if errors.As(err, &syn) {
			return NewError(CodeBadFrame, "frame is not valid JSON")
		}
		return NewError(CodeBadFrame, "frame is not a JSON object")
	}
	t, ok := head.T.(string)
	if !ok {
		return NewError(CodeBadFrame, "frame type (t) must be a string")
	}
	if t == "" {
		// As in Decode: an empty t is a missing type, not an unknown one.
		return NewError(CodeBadFrame, "frame has no type (t)")
	}
	if !knownClientType(strings.ToLower(t)) {
		return nil
	}
	var sem *json.SemanticError
	if errors.As(err, &sem) && sem.JSONPointer != "" {
		return NewError(CodeBadFrame, "invalid value for "+strings.TrimPrefix(string(sem.JSONPointer), "/"))
	}
	return NewError(CodeBadFrame, "frame is not valid")
}

// TypeOf returns the lowercased t of msg, or "" when msg has none. It is
// for the error path: a caller that must judge a frame by its type before
// its contents (deliver permission) asks it after Decode failed.
func TypeOf(msg []byte) string {
	var head struct {
		T string `json:"t"`
	}
	if json.Unmarshal(msg, &head, decodeOpts) != nil {
		return ""
	}
	return strings.ToLower(head.T)
}

func knownClientType(t string) bool {
	switch t {
	case TypeHello, TypeText, TypeAudio, TypeMedia, TypePrompt, TypeTyping, TypePing, TypeAck, TypeDeliver, TypePush:
		return true
	}
	return false
}

func decodeHello(w *wire) (ClientFrame, *Error) {
	h := &Hello{Token: w.Token}
	if w.Device != nil {
		h.Device = Device{
			ID:         Truncate(w.Device.ID, MaxDeviceFieldChars),
			Name:       Truncate(w.Device.Name, MaxDeviceFieldChars),
			Platform:   Truncate(w.Device.Platform, MaxDeviceFieldChars),
			AppVersion: Truncate(w.Device.AppVersion, MaxDeviceFieldChars),
		}
	}
	if w.User != nil {
		h.User = User{
			ID:   Truncate(w.User.ID, MaxUserFieldChars),
			Name: Truncate(w.User.Name, MaxUserFieldChars),
		}
	}
	return h, nil
}

func decodeText(w *wire) (ClientFrame, *Error) {
	if w.ID == "" {
		return nil, NewError(CodeBadFrame, "text frame needs an id")
	}
	if w.Text == "" {
		return nil, NewError(CodeBadFrame, "text is empty")
	}
	if e := checkText("text", w.Text); e != nil {
		return nil, e
	}
	return &Text{ID: Truncate(w.ID, MaxIDChars), Text: w.Text}, nil
}

func decodeAudio(w *wire) (ClientFrame, *Error) {
	if w.ID == "" {
		return nil, NewError(CodeBadFrame, "audio frame needs an id")
	}
	if w.Format == "" {
		return nil, NewError(CodeBadFrame, "audio frame needs a format")
	}
	format := strings.ToLower(w.Format)
	if !contains(AudioFormats, format) {
		return nil, NewError(CodeUnsupportedFrame, "audio format must be wav or ogg")
	}
	if len(w.Data) == 0 {
		return nil, NewError(CodeBadFrame, "audio frame needs data")
	}
	if len(w.Data) > MaxAudioBytes {
		return nil, NewError(CodeTooBig, "audio is larger than "+MiB(MaxAudioBytes))
	}
	if e := checkText("text", w.Text); e != nil {
		return nil, e
	}
	return &Audio{ID: Truncate(w.ID, MaxIDChars), Format: format, Data: w.Data, Text: w.Text}, nil
}

func decodeMedia(w *wire) (ClientFrame, *Error) {
	if w.ID == "" {
		return nil, NewError(CodeBadFrame, "media frame needs an id")
	}
	if w.Kind == "" {
		return nil, NewError(CodeBadFrame, "media frame needs a kind")
	}
	w.Kind = strings.ToLower(w.Kind)
	if !IsMediaIn(w.Kind) {
		return nil, NewError(CodeUnsupportedFrame, "media kind must be image, video, document or audio")
	}
	if len(w.Data) == 0 {
		return nil, NewError(CodeBadFrame, "media frame needs data")
	}
	part, parts := int64(0), int64(1)
	if w.Part != nil {
		part = *w.Part
	}
	if w.Parts != nil {
		parts = *w.Parts
	}
	if parts < 1 || parts > MaxMediaParts {
		return nil, NewError(CodeBadFrame, "parts must be between 1 and 2048")
	}
	if part < 0 || part >= parts {
		return nil, NewError(CodeBadFrame, "part must be between 0 and parts-1")
	}
	if len(w.Data) > MaxMediaBytes {
		return nil, NewError(CodeTooBig, "media file is larger than "+MiB(MaxMediaBytes))
	}
	if e := checkText("caption", w.Caption); e != nil {
		return nil, e
	}
	filename := Truncate(w.Filename, MaxFilenameChars)
	return &MediaUp{
		ID:       Truncate(w.ID, MaxIDChars),
		Kind:     w.Kind,
		Mime:     MimeOf(mimeOf(w.Mime), w.Filename), // the extension survives truncation
		Filename: filename,
		Caption:  w.Caption,
		Data:     w.Data,
		Part:     int(part),
		Parts:    int(parts),
	}, nil
}

func decodePrompt(w *wire) (ClientFrame, *Error) {
	if w.PromptID == "" {
		return nil, NewError(CodeBadFrame, "prompt answer needs a prompt_id")
	}
	if w.OptionID == "" && w.Text == "" {
		return nil, NewError(CodeBadFrame, "prompt answer needs an option_id or a text")
	}
	if e := checkText("text", w.Text); e != nil {
		return nil, e
	}
	return &PromptAnswer{PromptID: Truncate(w.PromptID, MaxIDChars), OptionID: Truncate(w.OptionID, MaxIDChars), Text: w.Text}, nil
}

func decodeDeliver(w *wire) (ClientFrame, *Error) {
	b := DeliverBody{Target: w.Target, ID: w.ID, Text: w.Text, Media: w.Media, Wait: w.Wait, TTL: w.TTL}
	d, e := b.Frame()
	if e != nil {
		return nil, e
	}
	return d, nil
}

// decodePush checks a push frame: a kind of PushKinds (any case), and a
// token (empty: remove) of printable ASCII, at most MaxPushTokenBytes.
// Its errors never quote the token.
func decodePush(w *wire) (ClientFrame, *Error) {
	if w.Kind == "" {
		return nil, NewError(CodeBadFrame, "push frame needs a kind: fcm or apns")
	}
	kind := strings.ToLower(w.Kind)
	if !contains(PushKinds, kind) {
		return nil, NewError(CodeUnsupportedFrame, "push kind must be fcm or apns")
	}
	if len(w.Token) > MaxPushTokenBytes {
		return nil, NewError(CodeTooBig, "push token is longer than "+strconv.Itoa(MaxPushTokenBytes)+" bytes")
	}
	for i := 0; i < len(w.Token); i++ {
		if c := w.Token[i]; c <= ' ' || c >= 0x7f {
			return nil, NewError(CodeBadFrame, "push token must be printable ASCII, without spaces")
		}
	}
	return &Push{Kind: kind, Token: strings.Clone(w.Token)}, nil
}

// checkText enforces MaxTextChars on a text or caption.
func checkText(field, s string) *Error {
	// A string of at most MaxTextChars bytes cannot hold more code points.
	if len(s) > MaxTextChars && utf8.RuneCountInString(s) > MaxTextChars {
		return NewError(CodeTooBig, field+" is longer than "+strconv.Itoa(MaxTextChars)+" characters")
	}
	return nil
}

// Truncate cuts s to at most n Unicode code points. A cut string is a
// copy: it does not keep the rest of s in memory (a 15 MiB id cut to 128
// characters holds at most 512 bytes).
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := 0
	for pos := range s {
		if i == n {
			return strings.Clone(s[:pos])
		}
		i++
	}
	return s
}

// mimeOf returns m, or "" when m is longer than MaxMimeChars: no media
// type is (RFC 6838 allows 127 characters on either side of the slash), so
// the type comes from the filename instead.
func mimeOf(m string) string {
	if len(m) > MaxMimeChars {
		return ""
	}
	return m
}

// MimeOf returns m, or the type the filename's extension names, or
// application/octet-stream.
func MimeOf(m, filename string) string {
	if m != "" {
		return m
	}
	if ext := path.Ext(filename); ext != "" {
		if t := mime.TypeByExtension(strings.ToLower(ext)); t != "" {
			return t
		}
	}
	return "application/octet-stream"
}
