package router

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// deliver is POST /v1/deliver: cron's message to a device that is online
// now, or (with a ttl) kept for its next connection. Its body is the
// protocol's deliver frame without t, decoded into the same
// protocol.DeliverBody, validated by the same Frame and delivered by the
// same dispatch.Deliverer as the edge's deliver frame; the answer means
// what the frame's does (docs/api.md):
//
//   - 200: the phone has it (the frame's delivered);
//   - 202: written, not acknowledged in time (device_offline on the frame);
//   - 202 {"queued":true}: with a ttl, kept in the device's outbox for it
//     (the device did not take it now) and sent on its next connection
//     (the frame's delivered with "queued":true);
//   - 404 device_offline: no edge holds the device and no ttl; nothing is
//     kept for it.
func (a *API) deliver(w http.ResponseWriter, req *http.Request) error {
	var body protocol.DeliverBody
	if err := a.decode(w, req, &body); err != nil {
		return err
	}
	f, e := body.Frame()
	if e != nil {
		return protocolErr(e)
	}
	owner := ownerOf(req)
	if err := a.takeDeliveries(w, req, owner, 1); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(req.Context(), dispatch.DefaultTimeout+dispatch.KeepMargin)
	defer cancel()
	d, err := a.deliverer.DeliverAs(ctx, owner, f)
	a.countDelivery(owner, d, err)
	status, err := deliverStatus(d, err)
	if err != nil {
		return err
	}
	admin.WriteJSON(w, status, okBody{OK: true, ID: d.ID, Queued: d.Outcome == dispatch.Queued})
	return nil
}

// deliverStatus is the answer to a delivery that Deliver answered d and
// err for: 200 (delivered) or 202 (written, or queued with a ttl), or the
// error to answer with (err itself when the store or the bus failed).
func deliverStatus(d dispatch.Delivery, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	switch d.Outcome {
	case dispatch.Delivered:
		return http.StatusOK, nil
	case dispatch.Written, dispatch.Queued:
		return http.StatusAccepted, nil
	case dispatch.Offline:
		return 0, apiErr(http.StatusNotFound, protocol.CodeDeviceOffline, "device "+d.DeviceID()+" is not online")
	case dispatch.Refused:
		return 0, protocolErr(d.Refusal)
	}
	return 0, fmt.Errorf("delivery %s: outcome %q", d.ID, d.Outcome)
}

// codeTooManyDeliveries answers a delivery past its owner's
// deliveries_per_second.
const codeTooManyDeliveries protocol.Code = "too_many_deliveries"

// takeDeliveries takes n deliveries (those of a request that are valid)
// of owner's deliveries_per_second quota, counted in the store across
// every router; nil when they fit, or for the legacy owner, which has no
// quota. Past it the whole request is refused, 429 with the seconds
// until the next second of the store's clock in Retry-After, and costs
// the quota nothing.
func (a *API) takeDeliveries(w http.ResponseWriter, req *http.Request, owner string, n int) error {
	if owner == tenant.Legacy || n == 0 {
		return nil
	}
	limit := a.cfg.Tenants.Snapshot().QuotaOf(owner).DeliveriesPerSecond
	ok, _, left, err := a.r.store.TakeRate(req.Context(), tenant.QuotaKey(owner, tenant.QuotaDeliveries), int64(n), int64(limit), time.Second)
	if err != nil || ok {
		return err
	}
	a.r.tel.process.QuotaRefused(telemetry.QuotaDeliveries)
	a.cfg.Usage.Refused(owner, tenant.QuotaDeliveries, int64(n))
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int((left+time.Second-1)/time.Second))))
	return apiErr(http.StatusTooManyRequests, codeTooManyDeliveries,
		fmt.Sprintf("owner %s may ask %d deliveries a second across the gateway (its deliveries_per_second quota), and this request's %d do not fit in this second", owner, limit, n))
}

// countDelivery counts a delivery of owner that Deliver answered d and
// err for in its usage: accepted (200, 202) or offline (404); a refused
// one, or one the store or the bus failed, is neither.
func (a *API) countDelivery(owner string, d dispatch.Delivery, err error) {
	if err != nil {
		return
	}
	switch d.Outcome {
	case dispatch.Delivered, dispatch.Written, dispatch.Queued:
		a.cfg.Usage.Delivery(owner, true)
	case dispatch.Offline:
		a.cfg.Usage.Delivery(owner, false)
	}
}

// batchTimeout bounds one POST /v1/deliver/batch: the deliveries a batch
// request settles take one DefaultTimeout; those sent one by one after it
// another.
const batchTimeout = 2*dispatch.DefaultTimeout + dispatch.KeepMargin

// batchBody is the body of POST /v1/deliver/batch; each delivery is the
// body of a POST /v1/deliver, decoded on its own.
type batchBody struct {
	Deliveries []jsontext.Value `json:"deliveries"`
}

// batchResult is the answer for one delivery of a batch: the status and
// the error body a POST /v1/deliver of it answers, and its id.
type batchResult struct {
	ID     string     `json:"id,omitempty"`
	Status int        `json:"status"`
	Queued bool       `json:"queued,omitempty"` // a ttl: kept in the device's outbox (202)
	Error  *errorBody `json:"error,omitempty"`
}

// deliverBatch is POST /v1/deliver/batch: many deliveries in one request,
// for cron jobs that fan out. Each is decoded, validated and delivered as
// POST /v1/deliver does it (the same decodeJSON, Frame and Deliverer,
// through DeliverBatch), and answered with the status and error that POST
// would answer, in order; a delivery that fails does not fail the others.
// The request's own status is 200 once the batch was read; 400 or 413 only
// for a batch that cannot be (docs/api.md).
func (a *API) deliverBatch(w http.ResponseWriter, req *http.Request) error {
	var body batchBody
	if err := a.decodeWithin(w, req, &body, a.cfg.MaxBatchBytes); err != nil {
		return err
	}
	n := len(body.Deliveries)
	if n == 0 {
		return badFrame(`a batch needs deliveries: {"deliveries": [{"target": …, "text": …}, …]}`)
	}
	if n > a.cfg.MaxBatchItems {
		return apiErr(http.StatusRequestEntityTooLarge, protocol.CodeTooBig, fmt.Sprintf("a batch holds at most %d deliveries, not %d", a.cfg.MaxBatchItems, n))
	}
	results := make([]batchResult, n)
	failed := func(i int, id string, err error) {
		e := a.answerFor(req, err)
		results[i] = batchResult{ID: id, Status: e.status, Error: &errorBody{Error: string(e.code), Message: e.message}}
	}
	fs := make([]*protocol.Deliver, 0, n)
	at := make([]int, 0, n)
	for i, raw := range body.Deliveries {
		var b protocol.DeliverBody
		if err := decodeJSON(raw, &b, "a delivery"); err != nil {
			failed(i, b.ID, err)
			continue
		}
		f, e := b.Frame()
		if e != nil {
			failed(i, b.ID, protocolErr(e))
			continue
		}
		fs = append(fs, f)
		at = append(at, i)
	}
	body.Deliveries = nil // the files' bytes are in fs now
	owner := ownerOf(req)
	if err := a.takeDeliveries(w, req, owner, len(fs)); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(req.Context(), batchTimeout)
	defer cancel()
	for k, r := range a.deliverer.DeliverBatchAs(ctx, owner, fs) {
		a.countDelivery(owner, r.Delivery, r.Err)
		status, err := deliverStatus(r.Delivery, r.Err)
		if err != nil {
			failed(at[k], r.Delivery.ID, err)
			continue
		}
		results[at[k]] = batchResult{ID: r.Delivery.ID, Status: status, Queued: r.Delivery.Outcome == dispatch.Queued}
	}
	admin.WriteJSON(w, http.StatusOK, struct {
		Results []batchResult `json:"results"`
	}{results})
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

// deviceKey is the device key (tenant.DeviceKey) of the device id that
// req names: a device of the owner of req's credential, never another's.
func deviceKey(req *http.Request, device string) (string, error) {
	if err := checkDevice(device); err != nil {
		return "", err
	}
	key, err := tenant.Scope(ownerOf(req), device)
	if err != nil {
		return "", badFrame("%v", err)
	}
	return key, nil
}

// checkDevice rejects device ids that no device can have.
func checkDevice(device string) error {
	var e *protocol.Error
	if errors.As(protocol.CheckDeviceID(device), &e) {
		return protocolErr(e)
	}
	return nil
}
