package router

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// deliverRequest is the body of POST /v1/deliver: the protocol's deliver
// frame without t.
type deliverRequest struct {
	Target string       `json:"target"`
	ID     string       `json:"id"`
	Text   string       `json:"text"`
	Media  *deliverFile `json:"media"`
	// Wait is "" (answer once written) or "ack" (once the phone
	// acknowledged it, or 202 when it did not in time).
	Wait string `json:"wait"`
}

type deliverFile struct {
	Kind     string `json:"kind"`
	Mime     string `json:"mime"`
	Filename string `json:"filename"`
	Data     []byte `json:"data"` // base64 in the JSON
}

// deliver is POST /v1/deliver: cron's message to a device that is online
// now. As with the protocol's deliver frame, a device that is not online is
// told to the caller (404 device_offline), and nothing is kept for it.
func (a *API) deliver(w http.ResponseWriter, req *http.Request) error {
	var body deliverRequest
	if err := a.decode(w, req, &body); err != nil {
		return err
	}
	if err := body.validate(); err != nil {
		return err
	}
	target := strings.TrimPrefix(body.Target, protocol.SessionPrefix)
	if target == "" {
		target = a.cfg.HomeDevice
	}
	if target == "" {
		return badFrame("deliver needs a target: none given and no MOBILE_HOME_DEVICE")
	}
	if err := checkDevice(target); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(req.Context(), dispatch.DefaultTimeout)
	defer cancel()
	id := protocol.Truncate(body.ID, protocol.MaxIDChars)
	if id == "" {
		id = ids.New("d")
	}
	offline := apiErr(http.StatusNotFound, protocol.CodeDeviceOffline, "device "+target+" is not online")
	status := http.StatusOK // 202 once something was written but not acknowledged
	send := func(out wire.Output) error {
		out.WaitAck = body.Wait == "ack"
		acked, err := a.r.sender.SendAcked(ctx, out)
		switch {
		case errors.Is(err, dispatch.ErrNotAcked), err == nil && out.WaitAck && !acked:
			status = http.StatusAccepted
			return nil
		case errors.Is(err, dispatch.ErrOffline):
			return offline
		}
		return err
	}
	// The text first, then the file, as the edge's deliver does.
	if body.Text != "" {
		if err := send(wire.Output{Op: wire.OpMessage, Device: target, ID: id, Text: body.Text, Final: true}); err != nil {
			return err
		}
	}
	if m := body.Media; m != nil {
		if body.Text == "" {
			// Do not keep up to 8 MiB for a device that has no owner
			// record. (Right after a Redis restart a connected device may
			// lack one until its edge's next heartbeat: cron is told to
			// retry, which it would be told anyway while Redis is away.)
			if _, err := a.r.store.DeviceOwner(ctx, target); errors.Is(err, store.ErrNotFound) {
				return offline
			} else if err != nil {
				return err
			}
		}
		key, err := a.r.store.PutBlob(ctx, m.Data, a.r.cfg.BlobTTL)
		if err != nil {
			return err
		}
		if err := send(wire.Output{Op: wire.OpMedia, Device: target, ID: id + "-media", Media: &wire.MediaRef{
			Kind: m.Kind, Mime: m.Mime, Filename: m.Filename, Size: len(m.Data), Blob: key,
		}}); err != nil {
			return err
		}
	}
	admin.WriteJSON(w, status, okBody{OK: true, ID: id})
	return nil
}

// validate applies the checks of the protocol's deliver frame
// (protocol.Decode) and normalizes the media fields as it does.
func (d *deliverRequest) validate() error {
	if m := d.Media; m != nil {
		if m.Kind == "" || len(m.Data) == 0 {
			return badFrame("deliver media needs a kind and data")
		}
		m.Kind = strings.ToLower(m.Kind)
		if !protocol.IsMediaOut(m.Kind) {
			return unsupported("deliver media kind must be image, voice, video, document or animation")
		}
		if len(m.Data) > protocol.MaxMediaBytes {
			return tooBig("media file is larger than %s", protocol.MiB(protocol.MaxMediaBytes))
		}
		m.Mime = protocol.MimeOf(m.Mime, m.Filename)
		m.Filename = protocol.Truncate(m.Filename, protocol.MaxFilenameChars)
	}
	if d.Text == "" && d.Media == nil {
		return badFrame("deliver needs text or media")
	}
	if d.Wait != "" && d.Wait != "ack" {
		return badFrame(`deliver wait must be "ack" or absent`)
	}
	return checkText("text", d.Text, protocol.MaxTextChars)
}

// checkText bounds s at max characters (Unicode code points).
func checkText(field, s string, max int) error {
	if len(s) > max && utf8.RuneCountInString(s) > max {
		return tooBig("%s is longer than %d characters", field, max)
	}
	return nil
}

// checkDevice rejects device ids that no device can have: the edge cuts
// them at 120 characters.
func checkDevice(device string) error {
	if utf8.RuneCountInString(device) > protocol.MaxDeviceFieldChars {
		return badFrame("a device id has at most %d characters", protocol.MaxDeviceFieldChars)
	}
	return nil
}
