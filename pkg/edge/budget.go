package edge

import "sync/atomic"

// DefaultBudgetBytes is the default of each of an edge's byte budgets
// (reads, outbound queues, uploads): three of them stay well inside the
// chart's 1 GiB memory limit.
const DefaultBudgetBytes = 256 << 20

// Defaults of the hello phase (Config.MaxHelloBytes, MaxHelloConns,
// MaxHelloConnsPerAddr, HelloPrefixV4 and HelloPrefixV6). Each socket in
// the phase holds at most 12 KiB of messages, so 16 MiB admits 1,365 at
// once, the binding bound by default: a phone is in the phase for a round
// trip and two store calls, so that is what an edge answering thousands
// of hellos a second has in flight; past it a crowd is shed with a
// Retry-After. 256 strangers per source leave room for a carrier's NAT;
// an IPv6 client holds a whole /64, so that is one source.
const (
	DefaultHelloBytes        = 16 << 20
	DefaultHelloConns        = 10_000
	DefaultHelloConnsPerAddr = 256
	DefaultHelloPrefixV4     = 32
	DefaultHelloPrefixV6     = 64
)

// queueFloor is what a connection may always queue, over MaxQueuedBytes or
// not: a phone that reads is never cut off for what other sockets hold.
const queueFloor = 1 << 20

// budget is a byte budget shared by every connection of an edge: what one
// socket takes, no other can, so a few hostile sockets reach the bound
// long before the process runs out of memory.
type budget struct {
	limit   int64
	used    atomic.Int64
	refused atomic.Int64 // takes that did not fit (hermes_budget_exhausted_total)
}

// take reserves n bytes if they fit; exactly the limit fits.
func (b *budget) take(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			b.refused.Add(1)
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// force reserves n bytes whether or not they fit.
func (b *budget) force(n int64) { b.used.Add(n) }

// release returns n bytes taken before.
func (b *budget) release(n int64) { b.used.Add(-n) }

// inUse is what is reserved now.
func (b *budget) inUse() int64 { return b.used.Load() }

// BudgetsInUse reports what the edge's byte budgets hold now: message
// bytes being read, frames queued to phones, unfinished uploads.
func (s *Server) BudgetsInUse() (reading, queued, uploading int64) {
	return s.reading.inUse(), s.queued.inUse(), s.uploading.inUse()
}
