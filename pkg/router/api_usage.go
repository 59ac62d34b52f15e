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
	OutboxMiB   int `json:"outbox_mib"`
	Connections int `json:"connections"`
	EventReads  int `json:"event_reads"`
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
	OutboxMiB   int64 `json:"outbox_mib"`
	Connections int64 `json:"connections"`
	EventReads  int64 `json:"event_reads"`
}

// usageLive is the place of the counts of what is open now: the
// owner's sockets and event reads over every node. They are null until
// the store counts them across the cluster (the quotas' leases); no
// process's own count stands in for them.
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
			body.Quota = &usageQuota{OutboxMiB: t.Quota.OutboxMiB, Connections: t.Quota.Connections, EventReads: t.Quota.EventReads}
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
			EventReads: n(usage.RefusedEventReads)},
	}
}
