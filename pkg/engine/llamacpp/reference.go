package llamacpp

import (
	"fmt"

	"github.com/pdserve/pdserve/pkg/engine"
)

// GenerateReference generates n greedy tokens after prompt the way
// llama.cpp's own examples do (llama-simple): a fresh context holding one
// sequence, the prompt in one llama_batch_get_one call, then one token a
// call, each chosen by llama.cpp's greedy sampler. It shares nothing with
// Engine's batching, KV handling or sampling, so it is the oracle that the
// engine's output is checked against. ctxSize, threads and kvType as in
// Options (kvType 0: f16).
func (m *Model) GenerateReference(prompt []int32, n, ctxSize, threads int, kvType engine.DType) ([]int32, error) {
	a := m.api
	if kvType == 0 {
		kvType = engine.F16
	}
	kt, err := ggmlKVType(kvType)
	if err != nil {
		return nil, err
	}
	p := a.contextDefaultParams()
	p.nCtx = uint32(ctxSize)
	p.nBatch = uint32(max(len(prompt), 1))
	p.nUBatch = min(p.nBatch, 512)
	p.nSeqMax = 1
	p.nThreads, p.nThreadsBatch = int32(threads), int32(threads)
	p.flashAttnType = flashAttnEnabled
	p.typeK, p.typeV = kt, kt
	p.noPerf = true
	ctx := a.initFromModel(m.ptr, p)
	if ctx == 0 {
		return nil, fmt.Errorf("llamacpp: reference context for %s", m.path)
	}
	defer a.free(ctx)
	smpl := a.samplerInitGreedy()
	defer a.samplerFree(smpl)
	in := append([]int32(nil), prompt...)
	var out []int32
	for len(out) < n {
		if rc := a.decode(ctx, a.batchGetOne(in, int32(len(in)))); rc != 0 {
			return out, fmt.Errorf("llamacpp: reference decode: llama_decode %d", rc)
		}
		keepAlive(in)
		t := a.samplerSample(smpl, ctx, -1)
		out = append(out, t)
		in = []int32{t}
	}
	return out, nil
}
