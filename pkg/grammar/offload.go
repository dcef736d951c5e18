package grammar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/pdserve/pdserve/pkg/engine"
)

// MaxStateBytes bounds the parse stacks of one matcher state (12 bytes a
// position): a grammar whose start is larger is refused when it is
// compiled with a *LimitError ("state bytes"), and a sequence that would
// reach a larger state is refused there (its mask allows no token).
const MaxStateBytes = 4 << 20

// CacheBytes bounds the states (stacks and masks) a compiled grammar
// keeps for its choices to share (Compiled.Offloaded); past it, a choice
// computes its states for itself.
const CacheBytes = 32 << 20

// node is one state of a compiled grammar's matcher over its
// vocabulary, with its mask: the tokens it allows, as a bit set over
// token ids (an end-of-generation id when the state is complete).
// Immutable once built, but for next and pend, which the table's mutex
// guards.
type node struct {
	stacks [][]pos
	part   partial
	allow  []uint64
	err    error // the state cannot be built (too large): it allows nothing
	bytes  int
	next   map[int32]*node // transitions computed so far (interned nodes only)
	pend   map[int32]*job  // transitions being computed
}

func (n *node) allows(id int32) bool {
	return id >= 0 && int(id>>6) < len(n.allow) && n.allow[id>>6]&(1<<(id&63)) != 0
}

// table is a compiled grammar's states, shared by the choices of its
// request: each distinct state's mask is computed once, and each
// transition once. Bounded by CacheBytes.
type table struct {
	mu    sync.Mutex
	nodes map[string]*node
	bytes int
}

// stateKey is the identity of a matcher state: its stacks and unfinished
// sequence.
func stateKey(stacks [][]pos, part partial) string {
	n := 8
	for _, st := range stacks {
		n += 4 + 12*len(st)
	}
	k := make([]byte, 0, n)
	k = binary.LittleEndian.AppendUint32(k, part.value)
	k = binary.LittleEndian.AppendUint32(k, uint32(int32(part.remain)))
	for _, st := range stacks {
		k = binary.LittleEndian.AppendUint32(k, uint32(len(st)))
		for _, p := range st {
			k = binary.LittleEndian.AppendUint32(k, uint32(p.rule))
			k = binary.LittleEndian.AppendUint32(k, uint32(p.alt))
			k = binary.LittleEndian.AppendUint32(k, uint32(p.i))
		}
	}
	return string(k)
}

// stateBytes is the memory of stacks' positions.
func stateBytes(stacks [][]pos) int {
	n := 0
	for _, st := range stacks {
		n += 24 + 12*len(st)
	}
	return n
}

// build returns the node of the state (stacks, part) of g over v, with
// its mask: from the table when it holds it, else computed and interned
// while the table has room. deadline, when not zero, bounds the mask's
// computation (Compile's budget): past it build returns errDeadline.
func (v *Vocab) build(g *Grammar, t *table, stacks [][]pos, part partial, deadline func() bool) (*node, error) {
	sb := stateBytes(stacks)
	if sb > MaxStateBytes {
		return nil, &LimitError{Limit: "state bytes", Max: MaxStateBytes}
	}
	key := stateKey(stacks, part)
	t.mu.Lock()
	if n, ok := t.nodes[key]; ok {
		t.mu.Unlock()
		return n, nil
	}
	t.mu.Unlock()
	d := v.dec
	if part.remain != 0 {
		d = decodeAll(v.pieces, part)
	}
	m := &Matcher{g: g, stacks: stacks, part: part}
	done := m.Complete()
	allow := make([]uint64, (len(v.pieces)+63)/64)
	cs := make([]cand, 0, len(v.pieces))
	for id := range int32(len(v.pieces)) {
		switch {
		case v.isEOG[id]:
			if done {
				allow[id>>6] |= 1 << (id & 63)
			}
		case d.bad[id]:
		default:
			cs = append(cs, cand{id, d.start[id]})
			allow[id>>6] |= 1 << (id & 63)
		}
	}
	if deadline != nil && deadline() {
		return nil, errDeadline
	}
	for _, c := range g.reject(d, stacks, cs) {
		allow[c.id>>6] &^= 1 << (c.id & 63)
	}
	boundTokens(g, d, stacks, allow)
	if deadline != nil && deadline() {
		return nil, errDeadline
	}
	n := &node{stacks: stacks, part: part, allow: allow, bytes: sb + 8*len(allow) + len(key)}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.nodes[key]; ok {
		return old, nil
	}
	if t.bytes+n.bytes <= CacheBytes {
		t.nodes[key] = n
		t.bytes += n.bytes
		n.next = map[int32]*node{}
	}
	return n, nil
}

var errDeadline = errors.New("grammar: deadline")

// advance returns the state after token id from n (which allows it).
func (v *Vocab) advance(g *Grammar, t *table, n *node, id int32) *node {
	m := &Matcher{g: g, stacks: n.stacks, part: n.part}
	if err := m.Accept(v.pieces[id]); err != nil {
		return &node{err: err}
	}
	next, err := v.build(g, t, m.stacks, m.part, nil)
	if err != nil {
		return &node{err: err}
	}
	return next
}

// job computes one transition of a table: from's successor after token,
// for every state waiting on it.
type job struct {
	v       *Vocab
	g       *Grammar
	t       *table
	from    *node
	token   int32
	waiters []*Offloaded
}

func (j *job) run() {
	next := j.v.advance(j.g, j.t, j.from, j.token)
	j.t.mu.Lock()
	if j.from.next != nil && next.err == nil {
		j.from.next[j.token] = next
	}
	delete(j.from.pend, j.token)
	ws := j.waiters
	j.waiters = nil
	j.t.mu.Unlock()
	for _, w := range ws {
		w.settle(next)
	}
}

// Offload runs the grammar work of decoding off a batch loop: each
// Offloaded state's advance over the token it accepted and the mask of
// the state it reaches, on at most Workers goroutines (started on
// demand, gone when idle), taking keys (tenants) in turn, one job of a
// key at a time, so that one key's grammars cannot hold the workers
// while another's wait. Safe for concurrent use.
type Offload struct {
	workers int
	wake    func()

	mu      sync.Mutex
	queues  map[uint64][]func()
	ring    []uint64 // keys with queued jobs, in turn
	running int
	changed chan struct{} // closed and replaced when a job ends
	done    atomic.Int64
}

// NewOffload returns an Offload of workers goroutines at most (at least
// 1) that calls wake (nil: nothing) after each job, so that a batch loop
// waiting for work looks again.
func NewOffload(workers int, wake func()) *Offload {
	if wake == nil {
		wake = func() {}
	}
	return &Offload{workers: max(1, workers), wake: wake, queues: map[uint64][]func(){}, changed: make(chan struct{})}
}

// Changed returns a channel closed when the next job ends.
func (o *Offload) Changed() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.changed
}

// Done is the number of functions run so far (Go's, and the transitions
// of Offloaded states).
func (o *Offload) Done() int64 { return o.done.Load() }

// Go runs f on one of o's goroutines under key, in turn with other
// keys' work: a key's queued functions run one at a time, in order, one
// per turn. Each ends by waking o's loop and Changed.
func (o *Offload) Go(key uint64, f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.queues[key]) == 0 {
		o.ring = append(o.ring, key)
	}
	o.queues[key] = append(o.queues[key], f)
	if o.running < o.workers {
		o.running++
		go o.work()
	}
}

// work runs queued jobs, a key's one at a time in turn, until none is
// left.
func (o *Offload) work() {
	for {
		o.mu.Lock()
		if len(o.ring) == 0 {
			o.running--
			o.mu.Unlock()
			return
		}
		key := o.ring[0]
		q := o.queues[key]
		f := q[0]
		q[0] = nil
		q = q[1:]
		o.ring = o.ring[1:]
		if len(q) == 0 {
			delete(o.queues, key)
		} else {
			o.queues[key] = q
			o.ring = append(o.ring, key)
		}
		o.mu.Unlock()
		f()
		o.done.Add(1)
		o.mu.Lock()
		close(o.changed)
		o.changed = make(chan struct{})
		o.mu.Unlock()
		o.wake()
	}
}

// Offloaded is one sequence's grammar state whose work runs on an
// Offload: Accept of a token checks it against the state's mask, and
// the state after it (its stacks and mask) is computed off the caller,
// shared with the request's other choices through its compiled
// grammar's table, while Ready reports false. Mask and Allows read the
// mask; called before Ready, they (and Accept, Complete) wait for it, so
// that the result never depends on timing: a batch loop asks Ready and
// leaves a sequence out of a step until it is. Not safe for concurrent
// use, but for Ready, which the batch loop may call at any time.
type Offloaded struct {
	c   *Compiled
	o   *Offload
	key uint64

	mu     sync.Mutex
	cur    *node // nil while the next state is computed
	ready  chan struct{}
	closed bool
}

var _ engine.GrammarState = (*Offloaded)(nil)

// Ready reports whether the state's mask is computed: Mask, Allows,
// Accept and Complete will not wait.
func (s *Offloaded) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur != nil || s.closed
}

// settle makes next the state's current one.
func (s *Offloaded) settle(next *node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		s.cur = next
		close(s.ready)
	}
}

// node waits for the current state.
func (s *Offloaded) node() *node {
	s.mu.Lock()
	n, ch := s.cur, s.ready
	s.mu.Unlock()
	if n != nil {
		return n
	}
	<-ch
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// Mask implements engine.Constraint: ids beyond the vocabulary, and
// every id of a state that could not be built, are masked.
func (s *Offloaded) Mask(logits []float32) {
	n := s.node()
	neg := float32(math.Inf(-1))
	for i := range logits {
		if !n.allows(int32(i)) {
			logits[i] = neg
		}
	}
}

// Allows implements engine.TokenChecker.
func (s *Offloaded) Allows(id int32) bool { return s.node().allows(id) }

// Complete reports whether the root rule may end here.
func (s *Offloaded) Complete() bool {
	n := s.node()
	return n.err == nil && (&Matcher{g: s.c.g, stacks: n.stacks}).Complete()
}

// Accept checks tokens against the masks of the states they pass, in
// order; the state after the last one is computed off the caller when it
// is not known yet (Ready). An end-of-generation token leaves the state
// as it is. Errors: ErrRejected (the state then stands after the tokens
// before the refused one).
func (s *Offloaded) Accept(tokens ...int32) error {
	v := s.c.src.vocab()
	for i, id := range tokens {
		n := s.node()
		if !n.allows(id) {
			if n.err != nil {
				return fmt.Errorf("%w: %w", ErrRejected, n.err)
			}
			return fmt.Errorf("%w: token %d", ErrRejected, id)
		}
		if v.isEOG[id] {
			continue
		}
		t := s.c.table
		t.mu.Lock()
		if next, ok := n.next[id]; ok {
			t.mu.Unlock()
			s.mu.Lock()
			s.cur = next
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		s.cur, s.ready = nil, make(chan struct{})
		s.mu.Unlock()
		if j := n.pend[id]; j != nil {
			j.waiters = append(j.waiters, s)
			t.mu.Unlock()
			continue
		}
		j := &job{v: v, g: s.c.g, t: t, from: n, token: id, waiters: []*Offloaded{s}}
		if n.next != nil {
			if n.pend == nil {
				n.pend = map[int32]*job{}
			}
			n.pend[id] = j
		}
		t.mu.Unlock()
		if i < len(tokens)-1 || s.o == nil {
			j.run() // replaying tokens, or no Offload: computed here
			continue
		}
		s.o.Go(s.key, j.run)
	}
	return nil
}

// Close implements engine.GrammarState: the state holds only Go memory.
func (s *Offloaded) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
}

// boundTokens clears from allow the tokens of one code point after
// which the matcher's stacks would pass its bounds (MaxDepth, maxStacks):
// the mask (reject) does not expand the stacks after a token's last code
// point, where Accept does, so it allows them, and a state whose tokens
// are sent before the state after them is computed (Offloaded) must not.
// It is conservative: a token whose stacks, expanded one by one, sum to
// more than maxStacks is cleared, which Accept's running count may
// still take. Tokens of more code points are left as reject decides;
// past the bounds in their middle, the state after them allows nothing.
func boundTokens(g *Grammar, d *decoded, stacks [][]pos, allow []uint64) {
	sizes := make([]int, len(stacks)) // 0: not expanded yet; -1: past a bound
	ok := map[rune]bool{}
	for id := range int32(len(d.bad)) {
		if allow[id>>6]&(1<<(id&63)) == 0 || d.start[id+1]-d.start[id] != 1 {
			continue
		}
		r := d.cps[d.start[id]]
		fits, seen := ok[r]
		if !seen {
			total := 0
			for i, st := range stacks {
				if len(st) == 0 || !g.top(st).matches(r) {
					continue
				}
				if sizes[i] == 0 {
					next := make([]pos, len(st))
					copy(next, st)
					next[len(st)-1].i++
					var out [][]pos
					if err := g.expand(next, &out); err != nil {
						sizes[i] = -1
					} else {
						sizes[i] = max(1, len(out))
					}
				}
				if sizes[i] < 0 {
					total = maxStacks + 1
					break
				}
				total += sizes[i]
			}
			fits = total <= maxStacks
			ok[r] = fits
		}
		if !fits {
			allow[id>>6] &^= 1 << (id & 63)
		}
	}
}
