package sim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
)

// Snapshot is the KV of a sequence's first tokens kept outside the engine
// (SnapshotKV): their content keys, 8 bytes a token, and any imported KV
// among them that the engine could not regenerate. Immutable; it renders
// the bytes ExportKV would return (SnapshotLayerKV) and restores the
// sequence into an engine sharing this one's KV generator (same profile,
// PayloadScale and Seed).
type Snapshot struct {
	gen     *kvgen
	keys    []uint64
	foreign [][]span // per layer; nil: none
}

// Tokens returns the tokens the snapshot holds.
func (s *Snapshot) Tokens() int { return len(s.keys) }

// errSnapshot reports a snapshot that is not one of this engine's kind.
var errSnapshot = errors.New("sim: not a snapshot of an engine with this KV generator")

// SnapshotKV returns the KV of seq's first tokens tokens as a *Snapshot
// without generating its bytes: a host tier keeps it in place of
// ExportKV's layers (a real engine copies its KV blocks to host memory;
// the sim engine's KV is a function of content keys it holds). It takes
// no modeled time and does not change seq. Errors: engine.ErrUnknownSeq,
// engine.ErrIncompleteKV (a layer holds fewer tokens than another),
// engine.ErrRange (tokens < 0 or more than seq holds).
func (e *Engine) SnapshotKV(seq engine.SeqID, tokens int) (any, error) {
	st := e.seqs[seq]
	if st == nil {
		return nil, fmt.Errorf("sim: snapshot seq %d: %w", seq, engine.ErrUnknownSeq)
	}
	if !st.complete() {
		return nil, fmt.Errorf("sim: snapshot seq %d: %w", seq, engine.ErrIncompleteKV)
	}
	if tokens < 0 || tokens > len(st.keys) {
		return nil, fmt.Errorf("sim: snapshot %d tokens of seq %d, which holds %d: %w", tokens, seq, len(st.keys), engine.ErrRange)
	}
	return &Snapshot{gen: e.gen, keys: slices.Clone(st.keys[:tokens:tokens]), foreign: e.clipForeign(st.foreign, tokens)}, nil
}

// RestoreKV creates seq, a sequence the engine does not hold, with the
// first tokens tokens of snap (a *Snapshot of an engine sharing this one's
// KV generator): ExportKV then returns the bytes the snapshot's sequence
// did. Like ImportKV it takes no modeled time (ChargeHostLoad prices the
// copy). Errors: engine.ErrDuplicateSeq (seq is live), engine.ErrRange
// (tokens < 0 or more than snap holds), engine.ErrSeqTooLong, or snap is
// not such a snapshot. On error nothing changes.
func (e *Engine) RestoreKV(seq engine.SeqID, snap any, tokens int) error {
	s, err := e.snapshot(snap)
	if err != nil {
		return fmt.Errorf("sim: restore seq %d: %w", seq, err)
	}
	if e.seqs[seq] != nil {
		return fmt.Errorf("sim: restore into live seq %d: %w", seq, engine.ErrDuplicateSeq)
	}
	if tokens < 0 || tokens > len(s.keys) {
		return fmt.Errorf("sim: restore %d tokens of a snapshot of %d into seq %d: %w", tokens, len(s.keys), seq, engine.ErrRange)
	}
	if tokens > e.spec.MaxSeqLen {
		return fmt.Errorf("sim: restore seq %d: %d tokens > %d: %w", seq, tokens, e.spec.MaxSeqLen, engine.ErrSeqTooLong)
	}
	st := &seqState{keys: slices.Clone(s.keys[:tokens:tokens]), layers: make([]int, e.spec.Layers), foreign: e.clipForeign(s.foreign, tokens)}
	for l := range st.layers {
		st.layers[l] = tokens
	}
	e.seqs[seq] = st
	return nil
}

// SnapshotLayerKV appends to dst the KV of layer for all of snap's tokens,
// the bytes ExportKV returned for them (for a tier that writes them out,
// e.g. to disk, or for a peer). It reads only snap and the engine's
// fixed KV generator, so it is safe to call concurrently with any method,
// steps included. Errors: engine.ErrRange (bad layer), or snap is not a
// snapshot of this engine's kind.
func (e *Engine) SnapshotLayerKV(snap any, layer int, dst []byte) ([]byte, error) {
	s, err := e.snapshot(snap)
	if err != nil {
		return dst, err
	}
	if layer < 0 || layer >= e.spec.Layers {
		return dst, fmt.Errorf("sim: snapshot layer %d outside [0, %d): %w", layer, e.spec.Layers, engine.ErrRange)
	}
	n, tb := len(s.keys), e.gen.tokenBytes()
	off := len(dst)
	dst = slices.Grow(dst, n*tb)[:off+n*tb]
	out := dst[off:]
	e.gen.fill(out, s.keys, layer)
	if s.foreign != nil {
		for _, sp := range s.foreign[layer] {
			e.copyTokens(out, n, sp.start, sp.data, sp.end-sp.start, 0, sp.end-sp.start)
		}
	}
	return dst, nil
}

func (e *Engine) snapshot(snap any) (*Snapshot, error) {
	s, ok := snap.(*Snapshot)
	if !ok || s == nil || s.gen != e.gen {
		return nil, errSnapshot
	}
	return s, nil
}

// clipForeign returns the spans of foreign (per layer) clipped to tokens
// [0, n), copied (nil when none is left).
func (e *Engine) clipForeign(foreign [][]span, n int) [][]span {
	if foreign == nil {
		return nil
	}
	row := e.gen.tokenBytes() / 2
	var out [][]span
	for l, spans := range foreign {
		for _, sp := range spans {
			if sp.start >= n {
				continue
			}
			if out == nil {
				out = make([][]span, e.spec.Layers)
			}
			// Keep tokens [sp.start, min(sp.end, n)): their K rows, then
			// their V rows.
			m, k := min(sp.end, n)-sp.start, sp.end-sp.start
			data := make([]byte, 0, 2*m*row)
			data = append(data, sp.data[:m*row]...)
			data = append(data, sp.data[k*row:(k+m)*row]...)
			out[l] = append(out[l], span{start: sp.start, end: sp.start + m, data: data})
		}
	}
	return out
}

// ChargeHostSpill queues bytes of KV (the model's true size) on the
// device-to-host direction of the host link (the profile's
// HostLinkBytesPerSec, PCIe) and returns when they will have crossed it on
// the engine's clock, after TimeScale: a worker's host tier copied an
// evicted sequence out. The copy is a DMA beside the compute, as a GPU's
// copy engine runs it: no step waits for it, but the spills queue behind
// each other, and a load of the spilled KV before then waits for the rest
// (WaitHostSpill). bytes ≤ 0 charge nothing (the clock's now).
func (e *Engine) ChargeHostSpill(bytes int64) time.Time {
	now := e.clock()
	if bytes <= 0 {
		return now
	}
	d := time.Duration(float64(bytes) / e.prof.HostLinkBytesPerSec() * float64(time.Second))
	e.spillBusy = later(now, e.spillBusy).Add(time.Duration(float64(d) * e.timeScale))
	e.statsMu.Lock()
	e.stats.HostSpill += d
	e.statsMu.Unlock()
	return e.spillBusy
}

// WaitHostSpill charges the next step the time left until ready (a
// ChargeHostSpill's answer): a load of spilled KV whose copy out has not
// finished waits for it. It returns that time as the engine will wait it
// out (after TimeScale), 0 when ready has passed.
func (e *Engine) WaitHostSpill(ready time.Time) time.Duration {
	w := ready.Sub(e.clock())
	if w <= 0 {
		return 0
	}
	d := time.Duration(float64(w) / e.timeScale)
	e.hostDebt += d
	e.statsMu.Lock()
	e.stats.HostSpillWait += d
	e.statsMu.Unlock()
	return w
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
