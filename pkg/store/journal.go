package store

import (
	"context"
	"errors"
	"time"
)

// Journal verdicts, tested with errors.Is.
var (
	// ErrJournalFull: the device's journal already holds its maximum of
	// entries.
	ErrJournalFull = errors.New("store: journal full")
	// ErrLeaseLost: the caller does not hold the journal's lease (it
	// expired and may have been taken by another owner, or was released).
	ErrLeaseLost = errors.New("store: journal lease not held")
)

// JournalLimits bound one device's journal.
type JournalLimits struct {
	// MaxLen is the most entries the journal holds; an append past it is
	// refused with ErrJournalFull.
	MaxLen int
	// Lease is how long a lease taken by the append lasts without renewal.
	Lease time.Duration
	// TTL: the journal (entries and lease) is forgotten this long after its
	// last append, so the journal of a device nobody works does not stay.
	TTL time.Duration
}

// JournalEntry is one entry of a device's journal. Seq is positive and
// grows in append order within the journal.
type JournalEntry struct {
	// Seq names the entry: greater than the Seq of every entry appended
	// before to the device's journal, also when the journal was forgotten
	// in between (a store restarted without its data), so a done Seq from
	// before never names a later entry.
	Seq  int64
	Data []byte
	// Takeovers counts how often the journal's lease was taken after its
	// deadline passed (its holder stopped renewing: it died, or was cut
	// off) while this entry was the oldest. A released lease does not
	// count. NextJournal reports it for the oldest entry; removing that
	// entry starts the count again at 0 for the next.
	Takeovers int
}

// Appended is what AppendJournal reports.
type Appended struct {
	// Leased: the owner holds the lease after the append.
	Leased bool
	// Head, when the append took the lease, is the oldest entry, with its
	// Takeovers; nil when the lease was held already (its worker reads on).
	Head *JournalEntry
}

// Journal keeps each device's events for a built-in agent durably until
// they are handled, one worker at a time per device.
//
// Exactly one owner (a router) works a device's journal at a time: it holds
// the journal's lease, a record of the owner and a deadline. The holder
// renews the lease while it works and reads the journal until it is empty;
// reading an empty journal releases the lease in the same atomic step, so
// an entry appended meanwhile is never left without a worker: either the
// read returns it, or the append finds the lease free and takes it. A
// lease whose deadline passes is free: TakeJournals hands the journals with
// entries and a free lease to a new owner, which is how the entries of an
// owner that died are worked by another.
//
// Entries are removed only by their worker once it has handled them, so an
// entry whose worker died mid-way is handled again (at least once). The
// journal counts those takeovers of its oldest entry (JournalEntry.Takeovers),
// so a worker can give up on an entry that kills every worker it reaches.
type Journal interface {
	// AppendJournal appends data to the end of device's journal, unless the
	// journal already holds lim.MaxLen entries (ErrJournalFull, nothing
	// changes). In the same atomic step it gives the lease to owner for
	// lim.Lease if the lease is free (counting a takeover of the oldest
	// entry when the lease had expired). It reports whether owner holds the
	// lease after the call (taken now, or held already), and when the call
	// took it, the journal's oldest entry as NextJournal with done 0 would
	// return it, so that a new worker starts without reading it. lim.MaxLen below 1
	// refuses every append; a lim.Lease or lim.TTL that is not positive is
	// an error.
	AppendJournal(ctx context.Context, device, owner string, data []byte, lim JournalLimits) (Appended, error)
	// NextJournal is the holder's step: it removes the entry done if it is
	// still the oldest (done 0 removes nothing), then returns the oldest
	// entry, with its Takeovers, and extends owner's lease to lease from now. When the journal is
	// empty it releases the lease and reports false. A retry after a lost
	// reply is harmless: done is removed once. ErrLeaseLost when owner does
	// not hold the lease; nothing changes then.
	NextJournal(ctx context.Context, device, owner string, done int64, lease time.Duration) (JournalEntry, bool, error)
	// RenewJournal extends owner's lease to lease from now; ErrLeaseLost when
	// owner does not hold it.
	RenewJournal(ctx context.Context, device, owner string, lease time.Duration) error
	// ReleaseJournal frees owner's lease, leaving the entries for the next
	// owner (TakeJournals hands them out at once). Releasing a lease that
	// owner does not hold does nothing.
	ReleaseJournal(ctx context.Context, device, owner string) error
	// TakeJournals gives owner the lease, for lease, of up to max journals
	// that hold entries and whose lease is free (released, or its deadline
	// passed; the latter counts a takeover of the oldest entry), and
	// returns their devices. Each such journal goes to exactly one caller. It looks at every journal of the backend, like
	// TakeExpired.
	TakeJournals(ctx context.Context, owner string, lease time.Duration, max int) ([]string, error)
}
