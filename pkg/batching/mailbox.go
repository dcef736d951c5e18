package batching

import "sync"

// Mailbox carries messages from any goroutine (a worker's request
// handlers, its KV receiver) to its batch loop, which takes them all at
// once at a step boundary. Post never blocks and never calls into its
// caller or the loop: its lock is a leaf, held only to append or take, so
// a party may post holding its own lock. The zero value is not usable;
// create it with NewMailbox.
type Mailbox[T any] struct {
	sig  *Signals
	mu   sync.Mutex
	msgs []T
}

// NewMailbox returns an empty mailbox that wakes sig's loop on each Post.
func NewMailbox[T any](sig *Signals) *Mailbox[T] { return &Mailbox[T]{sig: sig} }

// Post appends m and wakes the loop (Signals.Wake).
func (b *Mailbox[T]) Post(m T) {
	b.mu.Lock()
	b.msgs = append(b.msgs, m)
	b.mu.Unlock()
	b.sig.Wake()
}

// Take returns every message posted since the last Take, in the order
// posted, or nil. The caller owns the slice.
func (b *Mailbox[T]) Take() []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.msgs
	b.msgs = nil
	return m
}
