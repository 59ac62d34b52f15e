package router

import (
	"context"
	"errors"
	"net/http"
	"unicode/utf8"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// deliver is POST /v1/deliver: cron's message to a device that is online
// now. Its body is the protocol's deliver frame without t, decoded into the
// same protocol.DeliverBody, validated by the same Frame and delivered by
// the same dispatch.Deliverer as the edge's deliver frame; the answer
// means what the frame's does (docs/api.md):
//
//   - 200: the phone has it (the frame's delivered);
//   - 202: written, not acknowledged in time (device_offline on the frame);
//   - 404 device_offline: no edge holds the device; nothing is kept for it.
func (a *API) deliver(w http.ResponseWriter, req *http.Request) error {
	var body protocol.DeliverBody
	if err := a.decode(w, req, &body); err != nil {
		return err
	}
	f, e := body.Frame()
	if e != nil {
		return protocolErr(e)
	}
	ctx, cancel := context.WithTimeout(req.Context(), dispatch.DefaultTimeout)
	defer cancel()
	d, err := a.deliverer.Deliver(ctx, f)
	var perr *protocol.Error
	status := http.StatusOK
	switch {
	case errors.As(err, &perr):
		return protocolErr(perr)
	case errors.Is(err, dispatch.ErrOffline):
		return apiErr(http.StatusNotFound, protocol.CodeDeviceOffline, "device "+d.Device+" is not online")
	case err != nil:
		return err
	case d.Outcome == wire.OutcomeWritten:
		status = http.StatusAccepted
	}
	admin.WriteJSON(w, status, okBody{OK: true, ID: d.ID})
	return nil
}

// protocolErr answers a validation error of the protocol with its code.
func protocolErr(e *protocol.Error) *apiError {
	status := http.StatusBadRequest
	if e.Code == protocol.CodeTooBig {
		status = http.StatusRequestEntityTooLarge
	}
	return apiErr(status, e.Code, e.Message)
}

// checkText bounds s at max characters (Unicode code points).
func checkText(field, s string, max int) error {
	if len(s) > max && utf8.RuneCountInString(s) > max {
		return tooBig("%s is longer than %d characters", field, max)
	}
	return nil
}

// checkDevice rejects device ids that no device can have.
func checkDevice(device string) error {
	var e *protocol.Error
	if errors.As(protocol.CheckDeviceID(device), &e) {
		return protocolErr(e)
	}
	return nil
}
