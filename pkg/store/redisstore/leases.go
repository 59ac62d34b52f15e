package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// An edge's lease: P edge:{E} lives while the edge renews it (RenewEdge,
// every third of its ttl); P edge:{E}:seen, 24 h from the last renewal,
// says the edge holds leases. A record naming an edge that has seen and no
// lease reads as none; one naming an edge without seen (an edge of the
// release before leases, which refreshes each record) stands on its ttl.
//
// shim(v0.2.0): a record of an edge without seen, of the release before
// leases.

// leaseMemory is how long P edge:{E}:seen outlives the last renewal.
const leaseMemory = 24 * time.Hour

// leaseFresh is how long a reader trusts what it read of an edge's lease:
// a lapsed lease is seen within it, and a read of owner records costs no
// round trip for the lease while there are few edges.
const leaseFresh = time.Second

// renewEdgeScript sets the lease and its memory and reports whether the
// lease existed. KEYS: lease, seen. ARGV: ttl ms, memory ms.
var renewEdgeScript = redis.NewScript(`
local had = redis.call('EXISTS', KEYS[1])
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return had
`)

func (s *Store) leaseKey(edge string) string { return s.prefix + "edge:{" + edge + "}" }
func (s *Store) seenKey(edge string) string  { return s.prefix + "edge:{" + edge + "}:seen" }

// RenewEdge keeps edge's lease for ttl.
func (s *Store) RenewEdge(ctx context.Context, edge string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, opErr("RenewEdge", err)
	}
	if ttl <= 0 {
		return false, errBadTTL
	}
	had, err := renewEdgeScript.Run(ctx, s.rdb, []string{s.leaseKey(edge), s.seenKey(edge)}, ms(ttl), ms(leaseMemory)).Int64()
	if err != nil {
		return false, s.redisErr(ctx, "RenewEdge", err)
	}
	s.leases.set(edge, true, s.clock.Now())
	return had == 0, nil
}

// leaseCache is what this Store read of edges' leases.
type leaseCache struct {
	mu    sync.Mutex
	edges map[string]leaseRead
}

// leaseRead is whether an edge's records stood when it was read.
type leaseRead struct {
	stands bool
	at     time.Time
}

func (c *leaseCache) get(edge string, now time.Time) (stands, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.edges[edge]
	if !ok || now.Sub(r.at) >= leaseFresh {
		return false, false
	}
	return r.stands, true
}

func (c *leaseCache) set(edge string, stands bool, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.edges == nil {
		c.edges = make(map[string]leaseRead)
	}
	if len(c.edges) > 4096 { // edges come and go over days; forget them all at once
		clear(c.edges)
	}
	c.edges[edge] = leaseRead{stands: stands, at: now}
}

// standing keeps of owners (read by DeviceOwner(s)) those whose edge's
// records stand, and zeroes the others, reading the leases it does not
// know from the last second in one pipeline.
func (s *Store) standing(ctx context.Context, op string, owners []store.Owner) error {
	now := s.clock.Now()
	var unknown []string
	for _, o := range owners {
		if o.Edge == "" {
			continue
		}
		if _, ok := s.leases.get(o.Edge, now); !ok && !slices.Contains(unknown, o.Edge) {
			unknown = append(unknown, o.Edge)
		}
	}
	if len(unknown) > 0 {
		leases := make([]*redis.IntCmd, len(unknown))
		seen := make([]*redis.IntCmd, len(unknown))
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, e := range unknown {
				leases[i] = p.Exists(ctx, s.leaseKey(e))
				seen[i] = p.Exists(ctx, s.seenKey(e))
			}
			return nil
		})
		if err != nil {
			return s.redisErr(ctx, op, err)
		}
		for i, e := range unknown {
			s.leases.set(e, leases[i].Val() == 1 || seen[i].Val() == 0, now)
		}
	}
	for i, o := range owners {
		if o.Edge == "" {
			continue
		}
		if stands, _ := s.leases.get(o.Edge, now); !stands {
			owners[i] = store.Owner{}
		}
	}
	return nil
}
