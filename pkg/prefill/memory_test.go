package prefill

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/zap"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/runner"
)

// meteredEngine is the ref engine with a fixed KV memory it only
// measures: after every call that adds KV (Prefill, Fork, ImportKV) it
// sums the tokens of the sequences it holds and records the first time
// they exceed tokens, or their number seqs. Single goroutine: the
// property test drives it and the scheduler in one.
type meteredEngine struct {
	*ref.Engine
	tokens, seqs int
	live         map[engine.SeqID]bool
	over         string // the first excess, "" while within
}

func (e *meteredEngine) KVCapacity() (tokens, seqs int) { return e.tokens, e.seqs }

func (e *meteredEngine) check(op string) {
	n := 0
	for q := range e.live {
		l, _ := e.Engine.Len(q)
		n += l
	}
	if e.over == "" && (n > e.tokens || len(e.live) > e.seqs) {
		e.over = fmt.Sprintf("after %s: %d tokens in %d sequences, over %d in %d", op, n, len(e.live), e.tokens, e.seqs)
	}
}

func (e *meteredEngine) Prefill(ctx context.Context, batch []engine.PrefillItem, onKV engine.KVFunc) ([]engine.Output, error) {
	for _, it := range batch {
		e.live[it.Seq] = true
	}
	out, err := e.Engine.Prefill(ctx, batch, onKV)
	e.check("prefill")
	return out, err
}

func (e *meteredEngine) Fork(src, dst engine.SeqID, n int) error {
	e.live[dst] = true
	err := e.Engine.Fork(src, dst, n)
	e.check("fork")
	return err
}

func (e *meteredEngine) ImportKV(seq engine.SeqID, layer, start int, data []byte) error {
	e.live[seq] = true
	err := e.Engine.ImportKV(seq, layer, start, data)
	e.check("import")
	return err
}

func (e *meteredEngine) Free(seq engine.SeqID) {
	delete(e.live, seq)
	e.Engine.Free(seq)
}

// TestEngineMemoryProperty drives the prefill worker's scheduler (the
// FCFS policy, its prefix cache with host and disk tiers) step by step
// against an engine of 320 tokens in 8 sequences, from seeded random
// operations: arrivals of prompts sharing prefixes (forks, tier loads),
// some with a prefix pulled from a peer, cancels, and peers' exports
// that hold a cache entry pinned across steps. After every engine call
// and every step the engine holds at most its memory. The operations
// are a function of the seed: the scheduler runs on this goroutine, and
// the transfers' goroutines (to a receiver that takes everything) change
// no state the scheduler reads.
func TestEngineMemoryProperty(t *testing.T) {
	for seed := range uint64(4) {
		// Odd seeds run without exports: the forks and loads alone.
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { engineMemoryProperty(t, seed, 2000, seed%2 == 0) })
	}
}

func engineMemoryProperty(t *testing.T, seed uint64, steps int, exporting bool) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	eng := &meteredEngine{Engine: newEngine(t), tokens: 320, seqs: 8, live: map[engine.SeqID]bool{}}
	tok := int64(eng.Spec().KVBytesPerToken())
	o := smallOptions()
	o.ChunkTokens, o.MaxBatchTokens, o.MaxLivePrefills = 16, 64, 4096
	o.PrefixCache.HostBytes = 150 * tok
	o.PrefixCache.DiskBytes, o.PrefixCache.DiskDir = 600*tok, t.TempDir()
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	t.Cleanup(func() { _ = d.Close() })
	s, err := New(eng, d, o, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.fcfs.Shutdown()
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))

	// Bases whose prefixes prompts share, and each one's KV as a peer
	// would send it (1 to 3 blocks of it).
	bases := make([][]int32, 4)
	baseKV := make([][][]byte, len(bases))
	for i := range bases {
		bases[i] = prompt(96, int32(60+i))
		_, baseKV[i] = referenceKV(t, bases[i])
	}
	pulled := func(b, blocks int) *prefixcache.Pulled {
		n := blocks * 16
		p := &prefixcache.Pulled{Tokens: n, Tier: prefixcache.TierEngine, Layers: make([][]byte, len(baseKV[b]))}
		for l, data := range baseKV[b] {
			row := len(data) / (2 * 96)
			p.Layers[l] = append(append([]byte(nil), data[:n*row]...), data[96*row:(96+n)*row]...)
		}
		return p
	}

	var (
		ids             []string
		failed          int
		exports, pulls  int
		cancels, failsd int
	)
	step := func(op string) {
		b := s.fcfs.Plan()
		if b.Size() > 0 {
			res := runner.Result{Start: time.Now()}
			res.Prefill, res.Err = eng.Prefill(context.Background(), b.Prefill, b.OnKV)
			res.End = time.Now()
			if res.Err != nil {
				failed++
			}
			s.fcfs.Done(context.Background(), b, res)
		}
		eng.check(op)
		if eng.over != "" {
			t.Fatalf("seed %d, %s: engine overcommitted %s", seed, op, eng.over)
		}
	}
	for i := range steps {
		op := fmt.Sprintf("step %d", i)
		switch x := rng.IntN(100); {
		case x < 30 && s.Stats().QueuedRequests < 12:
			var p []int32
			var pl *prefixcache.Pulled
			b := rng.IntN(len(bases))
			switch rng.IntN(4) {
			case 0: // a prompt of its own
				p = prompt(17+rng.IntN(80), int32(1000+i))
			case 1: // a base's prefix, pulled from a peer
				k := 1 + rng.IntN(6)
				p = sharing(bases[b], 16*k+1+rng.IntN(24), 16*k, int32(2000+i))
				pl = pulled(b, k)
				pulls++
			default: // a base's prefix: a fork or a tier load
				k := 1 + rng.IntN(6)
				p = sharing(bases[b], 16*k+1+rng.IntN(24), 16*k, int32(3000+i))
			}
			id := fmt.Sprintf("r%d", i)
			req := &pdservev1.PrefillRequest{RequestId: id, PromptTokens: p, DecodeAddr: addr}
			hashes := s.cache.Hashes(0, p)
			disk := s.cache.ReadDisk(context.Background(), hashes, s.cache.MaxHitBlocks(len(p)))
			if _, _, err := s.enqueue(req, hashes, pl, disk); err != nil {
				t.Fatalf("%s: enqueue: %v", op, err)
			}
			ids = append(ids, id)
		case x < 38 && len(ids) > 0:
			// One of the latest arrivals: likely still queued or
			// prefilling.
			if s.Cancel(ids[max(0, len(ids)-1-rng.IntN(8))]) {
				cancels++
			}
		case x < 45 && exporting:
			// A peer's export pins the entry it copies across steps:
			// the scheduler runs one step at each of its layers.
			b := rng.IntN(len(bases))
			lock := func() func() {
				step(op + " (during an export)")
				return func() {}
			}
			if _, err := s.cache.Export(eng, lock, s.cache.Hashes(0, bases[b]), 1, 6); err != nil {
				failsd++
			}
			exports++
		default:
			step(op)
		}
	}
	for range 1000 {
		if s.Stats().QueuedRequests == 0 {
			break
		}
		step("drain")
	}
	st := s.Stats()
	if st.QueuedRequests != 0 || failed != 0 || failsd != 0 {
		t.Errorf("seed %d: %d requests still queued, %d steps and %d exports failed", seed, st.QueuedRequests, failed, failsd)
	}
	pc := st.PrefixCache
	if pc.Hits == 0 || pc.Host.Hits == 0 || pc.Disk.Hits == 0 || pc.Peer.HitTokens == 0 || (pc.Peer.Exports == 0) == exporting || pc.Reclaims == 0 || cancels == 0 {
		t.Errorf("seed %d: not every path ran: forks %d, host loads %d, disk loads %d, pulled tokens %d, exports %d, reclaims %d, cancels %d",
			seed, pc.Hits, pc.Host.Hits, pc.Disk.Hits, pc.Peer.HitTokens, pc.Peer.Exports, pc.Reclaims, cancels)
	}
	t.Logf("seed %d: %d arrivals (%d with a pull), %d cancels, %d exports; cache %+v", seed, len(ids), pulls, cancels, exports, pc)
}
