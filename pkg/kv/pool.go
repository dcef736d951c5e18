package kv

import (
	"errors"
	"fmt"
	"sync"
)

// BlockID names one block of a Pool: an integer in [0, Total()).
type BlockID int32

// Errors returned by this package, wrapped with detail; match with errors.Is.
var (
	// ErrPoolExhausted: an allocation asked for more blocks than are free.
	ErrPoolExhausted = errors.New("kv: block pool exhausted")
	// ErrUnknownBlock: a block id outside the pool.
	ErrUnknownBlock = errors.New("kv: unknown block")
	// ErrDoubleFree: a block released (or retained) while it holds no
	// reference, i.e. it is free.
	ErrDoubleFree = errors.New("kv: block is not allocated")
)

// Pool is a bounded pool of fixed-size token blocks. It keeps a reference
// count per block: Allocate hands out blocks with one reference, Retain adds
// one (a second holder of a shared prefix), Release drops one, and a block
// whose count reaches zero is free again.
//
// Pool is safe for concurrent use. Its memory is fixed at construction: no
// call allocates beyond the returned id slices.
type Pool struct {
	blockTokens int

	mu   sync.Mutex
	refs []int32   // reference count per block; 0 = free
	free []BlockID // stack of free blocks
}

// NewPool returns a pool of numBlocks blocks of blockTokens tokens each. Both
// must be positive, and numBlocks must fit a BlockID.
func NewPool(numBlocks, blockTokens int) (*Pool, error) {
	if numBlocks <= 0 || blockTokens <= 0 {
		return nil, fmt.Errorf("kv: new pool: %d blocks of %d tokens: both must be positive", numBlocks, blockTokens)
	}
	if numBlocks > 1<<31-1 {
		return nil, fmt.Errorf("kv: new pool: %d blocks exceeds the block id range", numBlocks)
	}
	p := &Pool{
		blockTokens: blockTokens,
		refs:        make([]int32, numBlocks),
		free:        make([]BlockID, numBlocks),
	}
	// Lowest ids on top of the stack, so a fresh pool hands out 0, 1, 2...
	for i := range p.free {
		p.free[i] = BlockID(numBlocks - 1 - i)
	}
	return p, nil
}

// BlockTokens returns the number of tokens per block.
func (p *Pool) BlockTokens() int { return p.blockTokens }

// BlocksFor returns the number of blocks that hold tokens tokens:
// ceil(tokens / BlockTokens()), and 0 for tokens ≤ 0.
func (p *Pool) BlocksFor(tokens int) int {
	if tokens <= 0 {
		return 0
	}
	return (tokens + p.blockTokens - 1) / p.blockTokens
}

// Allocate takes n free blocks, each with a reference count of one, and
// returns their ids; the caller owns the returned slice. It is all or
// nothing: when fewer than n blocks are free it takes none and returns an
// error wrapping ErrPoolExhausted that states the requested and free
// counts. Allocate(0) returns an empty slice; a negative n is an error.
func (p *Pool) Allocate(n int) ([]BlockID, error) {
	if n < 0 {
		return nil, fmt.Errorf("kv: allocate %d blocks: negative count", n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > len(p.free) {
		return nil, fmt.Errorf("kv: allocate %d blocks: %d free of %d: %w", n, len(p.free), len(p.refs), ErrPoolExhausted)
	}
	ids := make([]BlockID, n)
	top := len(p.free)
	for i := range ids {
		id := p.free[top-1-i]
		ids[i] = id
		p.refs[id] = 1
	}
	p.free = p.free[:top-n]
	return ids, nil
}

// Retain adds one reference to each block of ids (an id listed twice gets
// two). Every block must be allocated. It is all or nothing: on error
// (ErrUnknownBlock, ErrDoubleFree for a free block) no count changes.
func (p *Pool) Retain(ids []BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, id := range ids {
		if err := p.checkHeld(id); err != nil {
			return fmt.Errorf("kv: retain block %d (index %d): %w", id, i, err)
		}
	}
	for _, id := range ids {
		p.refs[id]++
	}
	return nil
}

// Release drops one reference from each block of ids (an id listed twice
// loses two); a block whose count reaches zero returns to the free list. It
// is all or nothing: when any id is outside the pool (ErrUnknownBlock) or
// would drop below zero references (ErrDoubleFree) no count changes.
func (p *Pool) Release(ids []BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, id := range ids {
		err := p.checkHeld(id)
		if err == nil {
			p.refs[id]--
			continue
		}
		// Undo the decrements made so far; none of them freed anything yet.
		for _, done := range ids[:i] {
			p.refs[done]++
		}
		return fmt.Errorf("kv: release block %d (index %d): %w", id, i, err)
	}
	for _, id := range ids {
		if p.refs[id] == 0 {
			p.refs[id] = -1 // mark, so an id listed twice is pushed once
			p.free = append(p.free, id)
		}
	}
	for _, id := range ids {
		if p.refs[id] < 0 {
			p.refs[id] = 0
		}
	}
	return nil
}

// refCount returns the reference count of id (0 when free or unknown).
func (p *Pool) refCount(id BlockID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id < 0 || int(id) >= len(p.refs) {
		return 0
	}
	return int(p.refs[id])
}

// checkHeld reports why id cannot take or lose a reference. Callers hold mu.
func (p *Pool) checkHeld(id BlockID) error {
	switch {
	case id < 0 || int(id) >= len(p.refs):
		return fmt.Errorf("id outside [0, %d): %w", len(p.refs), ErrUnknownBlock)
	case p.refs[id] <= 0:
		return ErrDoubleFree
	}
	return nil
}

// Free returns the number of free blocks.
func (p *Pool) Free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

// Total returns the number of blocks in the pool.
func (p *Pool) Total() int { return len(p.refs) }

// Used returns the number of blocks holding at least one reference:
// Total() - Free().
func (p *Pool) Used() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.refs) - len(p.free)
}
