package router

import (
	"context"
	"errors"
	"net/http"

	"github.com/hermes-mobile/gateway/pkg/admin"
)

// newHealth returns what answers the API's /healthz and /readyz: the
// admin port's handler (pkg/admin), so both ports answer alike. /readyz
// checks a store call and a bus round trip within ReadyTimeout, and fails
// once the router shuts down; /healthz fails while the bus connection is
// closed for good.
func (a *API) newHealth() *admin.Server {
	h := admin.New(a.log)
	h.SetCheckTimeout(a.cfg.ReadyTimeout)
	h.AddCheck("store", admin.StoreCheck(a.r.store))
	h.AddCheck("bus", admin.BusCheck(a.r.bus))
	h.AddCheck("router", func(context.Context) error {
		if a.r.quit.Err() != nil {
			return errors.New("the router is shutting down")
		}
		return nil
	})
	if live := admin.BusLive(a.r.bus); live != nil {
		h.AddLiveCheck("bus", live)
	}
	h.MarkReady()
	return h
}

// probe makes /healthz or /readyz of the admin server an endpoint. The
// handler is called directly, not through the admin server's mux, which
// would overwrite req.Pattern, the route the API's metrics count under.
func probe(h http.HandlerFunc) handlerFunc {
	return func(w http.ResponseWriter, req *http.Request) error {
		h(w, req)
		return nil
	}
}
