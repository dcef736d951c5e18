package kv

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Errors of Reservations, wrapped with detail; match with errors.Is.
var (
	ErrUnknownReservation   = errors.New("kv: unknown reservation")
	ErrDuplicateReservation = errors.New("kv: reservation exists")
)

// Allocator hands out and takes back blocks: *Pool, or *PrefixCache to let
// reservations reclaim unreferenced cached prefixes.
type Allocator interface {
	BlockTokens() int
	Allocate(n int) ([]BlockID, error)
	Release(ids []BlockID) error
}

var (
	_ Allocator = (*Pool)(nil)
	_ Allocator = (*PrefixCache)(nil)
)

// Reservations keeps the blocks reserved for each request, keyed by request
// id, so that a decode worker can promise KV room before the KV arrives and
// give it all back by id when the request ends or is cancelled. Safe for
// concurrent use.
type Reservations struct {
	alloc       Allocator
	blockTokens int

	mu  sync.Mutex
	res map[string][]BlockID
}

// NewReservations returns an empty set of reservations over alloc.
func NewReservations(alloc Allocator) *Reservations {
	return &Reservations{alloc: alloc, blockTokens: alloc.BlockTokens(), res: make(map[string][]BlockID)}
}

func (r *Reservations) blocksFor(tokens int) int {
	if tokens <= 0 {
		return 0
	}
	return (tokens + r.blockTokens - 1) / r.blockTokens
}

// Reserve allocates the blocks of tokens tokens (≥ 0) for request id and
// returns their ids (the caller owns the slice). Errors: ErrDuplicateReservation
// when id holds a reservation; the allocator's (ErrPoolExhausted) — then
// nothing is reserved.
func (r *Reservations) Reserve(id string, tokens int) ([]BlockID, error) {
	if tokens < 0 {
		return nil, fmt.Errorf("kv: reserve %d tokens for %q: negative count", tokens, id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.res[id]; ok {
		return nil, fmt.Errorf("kv: reserve for %q: %w", id, ErrDuplicateReservation)
	}
	ids, err := r.alloc.Allocate(r.blocksFor(tokens))
	if err != nil {
		return nil, fmt.Errorf("kv: reserve %d tokens for %q: %w", tokens, id, err)
	}
	r.res[id] = ids
	return slices.Clone(ids), nil
}

// Grow extends the reservation of id so that it holds at least tokens
// tokens, and returns the ids of the blocks it added (none when it already
// holds enough). Errors: ErrUnknownReservation; the allocator's — then the
// reservation is unchanged.
func (r *Reservations) Grow(id string, tokens int) ([]BlockID, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	have, ok := r.res[id]
	if !ok {
		return nil, fmt.Errorf("kv: grow %q: %w", id, ErrUnknownReservation)
	}
	need := r.blocksFor(tokens) - len(have)
	if need <= 0 {
		return nil, nil
	}
	ids, err := r.alloc.Allocate(need)
	if err != nil {
		return nil, fmt.Errorf("kv: grow %q to %d tokens: %w", id, tokens, err)
	}
	r.res[id] = append(have, ids...)
	return slices.Clone(ids), nil
}

// Release gives back every block of id's reservation and forgets it.
// Errors: ErrUnknownReservation; the allocator's (the reservation is
// forgotten regardless).
func (r *Reservations) Release(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids, ok := r.res[id]
	if !ok {
		return fmt.Errorf("kv: release %q: %w", id, ErrUnknownReservation)
	}
	delete(r.res, id)
	if err := r.alloc.Release(ids); err != nil {
		return fmt.Errorf("kv: release %q: %w", id, err)
	}
	return nil
}

// Blocks returns a copy of id's blocks, in reservation order, and whether id
// holds a reservation.
func (r *Reservations) Blocks(id string) ([]BlockID, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids, ok := r.res[id]
	return slices.Clone(ids), ok
}

// Tokens returns how many tokens id's reservation can hold (0 when unknown).
func (r *Reservations) Tokens(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.res[id]) * r.blockTokens
}

// Len returns the number of reservations held.
func (r *Reservations) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.res)
}
