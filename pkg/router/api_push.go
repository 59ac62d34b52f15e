package router

import (
	"net/http"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/push"
)

// pushDevice returns the path's {device}.
func pushDevice(req *http.Request) (string, error) {
	dev := req.PathValue("device")
	if dev == "" {
		return "", badFrame("the path needs a device id")
	}
	return deviceKey(req, dev)
}

// putPush is PUT /v1/devices/{device}/push: registers the device's push
// endpoint, {kind, url, token} (fcm and apns: {kind, token}, the app's
// own token, which the app may also register over its socket with a push
// frame), for push.TargetTTL (30 days), replacing any; registering again
// renews it.
func (a *API) putPush(w http.ResponseWriter, req *http.Request) error {
	dev, err := pushDevice(req)
	if err != nil {
		return err
	}
	var t push.Target
	if err := a.decode(w, req, &t); err != nil {
		return err
	}
	if len(t.URL) > push.MaxURLBytes {
		return tooBig("url is %d bytes, longer than %d", len(t.URL), push.MaxURLBytes)
	}
	// The form, the header values, a host that is an address the push
	// policy refuses (loopback, metadata, private, in any notation), a
	// service (fcm, apns) this router does not send to: a clear 400 now.
	// A name is checked on what it resolves to when a notification is
	// sent.
	if err := a.r.outbox.Notifier().Check(t); err != nil {
		return badFrame("%v", err)
	}
	if err := a.r.outbox.Notifier().Register(req.Context(), dev, t); err != nil {
		return err
	}
	admin.WriteJSON(w, http.StatusOK, okBody{OK: true})
	return nil
}

// deletePush is DELETE /v1/devices/{device}/push: the device gets no more
// push notifications. Deleting none is fine.
func (a *API) deletePush(w http.ResponseWriter, req *http.Request) error {
	dev, err := pushDevice(req)
	if err != nil {
		return err
	}
	if err := a.r.store.DeletePushTarget(req.Context(), dev); err != nil {
		return err
	}
	admin.WriteJSON(w, http.StatusOK, okBody{OK: true})
	return nil
}
