package protocol

import (
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

// DeliverBody is a delivery as cron sends it: the deliver frame's members
// (without t) and the JSON body of the router's POST /v1/deliver, which
// decode into this one type. Frame is its only validation.
type DeliverBody struct {
	Target string            `json:"target"`
	ID     string            `json:"id"`
	Text   string            `json:"text"`
	Media  *DeliverBodyMedia `json:"media"`
	// Wait is "" (answer once written to a phone that does not ack, or
	// once acknowledged by one that does) or "ack" (once acknowledged,
	// whatever the phone): an optional member, so Protocol v1 stays v1.
	Wait string `json:"wait"`
	// TTL, in seconds (optional, a whole number > 0), asks that a delivery
	// the device cannot take now be kept in its outbox that long and sent
	// on its next connection; without it such a delivery is refused
	// device_offline. Its upper bound is the service's (MOBILE_OUTBOX_TTL),
	// checked where the delivery is carried out.
	TTL *float64 `json:"ttl"`
}

// MaxDeliverTTLSeconds bounds a deliver's ttl before any service's own
// bound (MOBILE_OUTBOX_TTL, a day by default, is lower): it keeps the
// seconds within a time.Duration.
const MaxDeliverTTLSeconds = 1 << 31

// DeliverBodyMedia is the attachment of a DeliverBody.
type DeliverBodyMedia struct {
	Kind     string `json:"kind"`
	Mime     string `json:"mime"`
	Filename string `json:"filename"`
	Data     []byte `json:"data"` // base64 in the JSON
}

// Frame validates b and returns the delivery it asks for, or the error
// frame the specification names (bad_frame, unsupported_frame, too_big).
// The target is checked (DeliverTarget) but not resolved: an empty one is
// the home device, which the receiving service knows.
func (b *DeliverBody) Frame() (*Deliver, *Error) {
	d := &Deliver{ID: Truncate(b.ID, MaxIDChars), Target: b.Target, Text: b.Text}
	if m := b.Media; m != nil {
		if m.Kind == "" || len(m.Data) == 0 {
			return nil, NewError(CodeBadFrame, "deliver media needs a kind and data")
		}
		kind := strings.ToLower(m.Kind)
		if !IsMediaOut(kind) {
			return nil, NewError(CodeUnsupportedFrame, "deliver media kind must be image, voice, video, document or animation")
		}
		if len(m.Data) > MaxMediaBytes {
			return nil, NewError(CodeTooBig, "media file is larger than "+MiB(MaxMediaBytes))
		}
		// The extension survives the filename's truncation.
		d.Media = &DeliverMedia{Kind: kind, Mime: MimeOf(mimeOf(m.Mime), m.Filename), Filename: Truncate(m.Filename, MaxFilenameChars), Data: m.Data}
	}
	if d.Text == "" && d.Media == nil {
		return nil, NewError(CodeBadFrame, "deliver needs text or media")
	}
	if e := checkText("text", d.Text); e != nil {
		return nil, e
	}
	if b.Wait != "" && b.Wait != "ack" {
		return nil, NewError(CodeBadFrame, `deliver wait must be "ack" or absent`)
	}
	d.WaitAck = b.Wait == "ack"
	if t := b.TTL; t != nil {
		if *t <= 0 || *t != math.Trunc(*t) || *t > MaxDeliverTTLSeconds {
			return nil, NewError(CodeBadFrame, "deliver ttl must be a whole number of seconds greater than 0")
		}
		d.TTL = time.Duration(*t) * time.Second
	}
	if b.Target != "" {
		if _, e := DeliverTarget(b.Target, ""); e != nil {
			return nil, e
		}
	}
	return d, nil
}

// DeliverTarget returns the device a deliver's target names: mobile:<id>
// or a bare <id>; an empty target is home (MOBILE_HOME_DEVICE). A target
// that names no device, or one no device can have, is bad_frame.
func DeliverTarget(target, home string) (string, *Error) {
	device := strings.TrimPrefix(target, SessionPrefix)
	if target == "" {
		device = home
	}
	if device == "" {
		return "", NewError(CodeBadFrame, "deliver needs a target: none given and no MOBILE_HOME_DEVICE")
	}
	if e := checkDeviceID(device); e != nil {
		return "", NewError(CodeBadFrame, "deliver target: "+e.Message)
	}
	return device, nil
}

// CheckDeviceID refuses a device id that no device can have: hello cuts
// device ids at MaxDeviceFieldChars characters (and a device id becomes a
// bus subject). The error is a *Error with code bad_frame.
func CheckDeviceID(id string) error {
	if e := checkDeviceID(id); e != nil {
		return e
	}
	return nil
}

func checkDeviceID(id string) *Error {
	// A string of at most MaxDeviceFieldChars bytes cannot hold more code points.
	if n := len(id); n > MaxDeviceFieldChars {
		if n = utf8.RuneCountInString(id); n > MaxDeviceFieldChars {
			return NewError(CodeBadFrame, fmt.Sprintf("a device id has at most %d characters, not %d", MaxDeviceFieldChars, n))
		}
	}
	return nil
}
