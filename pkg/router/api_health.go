package router

import (
	"context"
	"net/http"
	"strings"
	"sync"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// readyBody is the answer of /readyz.
type readyBody struct {
	OK      bool   `json:"ok"`
	Store   string `json:"store"` // "ok" or what failed
	Bus     string `json:"bus"`
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
}

// healthz is GET /healthz: 200 while the process serves HTTP.
func (a *API) healthz(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, okBody{OK: true})
	return nil
}

// readyz is GET /readyz: 200 when a store call and a bus round trip both
// succeed within ReadyTimeout, 503 saying what failed otherwise.
func (a *API) readyz(w http.ResponseWriter, req *http.Request) error {
	ctx, cancel := context.WithTimeout(req.Context(), a.cfg.ReadyTimeout)
	defer cancel()
	var storeErr, busErr error
	var wg sync.WaitGroup
	wg.Go(func() { storeErr = admin.StoreCheck(a.r.store)(ctx) })
	wg.Go(func() { busErr = admin.BusCheck(a.r.bus)(ctx) })
	wg.Wait()
	body := readyBody{OK: true, Store: "ok", Bus: "ok"}
	var failed []string
	if storeErr != nil {
		body.OK, body.Store = false, storeErr.Error()
		failed = append(failed, "store: "+storeErr.Error())
	}
	if busErr != nil {
		body.OK, body.Bus = false, busErr.Error()
		failed = append(failed, "bus: "+busErr.Error())
	}
	if a.r.quit.Err() != nil {
		body.OK = false
		failed = append(failed, "the router is shutting down")
	}
	if body.OK {
		writeJSON(w, http.StatusOK, body)
		return nil
	}
	a.log.Warn("not ready", "reasons", strings.Join(failed, "; "))
	body.Error, body.Message = string(protocol.CodeInternalError), strings.Join(failed, "; ")
	writeJSON(w, http.StatusServiceUnavailable, body)
	return nil
}
