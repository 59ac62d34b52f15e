package router

import (
	"net/http"
	"time"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/usage"
)

// usageBody is the answer of GET /v1/usage (docs/api.md).
type usageBody struct {
	// Owner is the caller's owner: "" for the legacy owner.
	Owner string `json:"owner"`
	// Quota is the owner's quota from the tenants file, its defaults
	// filled; null for the legacy owner, which has none.
	Quota *usageQuota `json:"quota"`
	// Since is when the cluster began counting the owner: null while it
	// has counted nothing (or the store forgot it, usage.TTL).
	Since *time.Time `json:"since"`
	// Counters are the owner's counts over every node, as of each node's
	// last flush (at most about a second behind).
	Counters usageCounters `json:"counters"`
	// Live are what the owner holds open now, across the cluster: null
	// where the store keeps no such count yet.
	Live usageLive `json:"live"`
}

type usageQuota struct {
	OutboxMiB           int `json:"outbox_mib"`
	Connections         int `json:"connections"`
	EventReads          int `json:"event_reads"`
	DeliveriesPerSecond int `json:"deliveries_per_second"`
}

type usageCounters struct {
	MessagesIn        int64           `json:"messages_in"`
	MessagesOut       int64           `json:"messages_out"`
	Deliveries        usageDeliveries `json:"deliveries"`
	ConnectionsOpened int64           `json:"connections_opened"`
	QuotaRefusals     usageRefusals   `json:"quota_refusals"`
}

type usageDeliveries struct {
	Accepted int64 `json:"accepted"`
	Offline  int64 `json:"offline"`
}

// usageRefusals are by quota, named as the file's quota names them.
type usageRefusals struct {
	OutboxMiB           int64 `json:"outbox_mib"`
	Connections         int64 `json:"connections"`
	EventReads          int64 `json:"event_reads"`
	DeliveriesPerSecond int64 `json:"deliveries_per_second"`
}

// usageLive is what the owner holds open now over every node: its
// sockets and event reads, the live leases of its quotas in the store
// (store.LeaseCount). The legacy owner has no quota and so no leases:
// null for it, since no process's own count may stand in for the
// cluster's.
type usageLive struct {
	Connections *int64 `json:"connections"`
	EventReads  *int64 `json:"event_reads"`
}

// usage is GET /v1/usage: the caller's owner's quota and counters, read
// from the store, so every router answers the same. Only an agent key
// (or an agent token, the legacy owner's) may ask, and it is answered
// for its own owner: nothing in the request names another.
func (a *API) usage(w http.ResponseWriter, req *http.Request) error {
	owner := ownerOf(req)
	counts, since, err := a.r.store.Usage(req.Context(), owner)
	if err != nil {
		return err
	}
	body := usageBody{Owner: owner, Counters: countersOf(counts)}
	if !since.IsZero() {
		s := since.UTC()
		body.Since = &s
	}
	if owner != tenant.Legacy {
		// The snapshot of now: a quota changed by a reload is the new one.
		if t := a.cfg.Tenants.Snapshot().Tenant(owner); t != nil {
			q := t.Quota
			body.Quota = &usageQuota{OutboxMiB: q.OutboxMiB, Connections: q.Connections, EventReads: q.EventReads,
				DeliveriesPerSecond: q.DeliveriesPerSecond}
		}
		for _, l := range []struct {
			quota string
			dst   **int64
		}{{tenant.QuotaConnections, &body.Live.Connections}, {tenant.QuotaEventReads, &body.Live.EventReads}} {
			n, err := a.r.store.LeaseCount(req.Context(), tenant.QuotaKey(owner, l.quota))
			if err != nil {
				return err
			}
			v := int64(n)
			*l.dst = &v
		}
	}
	admin.WriteJSON(w, http.StatusOK, body)
	return nil
}

// countersOf are the store's counts as the answer names them.
func countersOf(c store.UsageCounts) usageCounters {
	n := func(x usage.Counter) int64 { return c[x.Name()] }
	return usageCounters{
		MessagesIn:        n(usage.MessagesIn),
		MessagesOut:       n(usage.MessagesOut),
		Deliveries:        usageDeliveries{Accepted: n(usage.DeliveriesAccepted), Offline: n(usage.DeliveriesOffline)},
		ConnectionsOpened: n(usage.ConnectionsOpened),
		QuotaRefusals: usageRefusals{OutboxMiB: n(usage.RefusedOutbox), Connections: n(usage.RefusedConnections),
			EventReads: n(usage.RefusedEventReads), DeliveriesPerSecond: n(usage.RefusedDeliveries)},
	}
}
