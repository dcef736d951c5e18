package decode

import (
	"fmt"
	"testing"
)

// BenchmarkPeerPullVerify is the decode worker's side of a peer pull
// and its spot check (peerpull.Check, Options.PeerPullVerifyBlocks), end
// to end on the reference engine: one local-prefill Generate call of a
// 520-token prompt (1 output token) on a new decode worker, whose
// prefix of 512 tokens (32 blocks) a prefill worker's cache holds.
// "compute" names no peer (the prompt is prefilled here); "pull/k=K"
// pulls the prefix over loopback gRPC and recomputes K of its blocks
// (0: unchecked, the pulled KV then serves the call only). A worker's
// setup is outside the timer. Compare k=1 (the default) with k=0 for
// the check's cost, and both with compute for what a pull saves:
//
//	go test -run '^$' -bench PeerPullVerify -benchtime 30x ./pkg/decode/
func BenchmarkPeerPullVerify(b *testing.B) {
	h := newHolder(b, newEngine(b), newEngine(b))
	base := prompt(520, 3)
	h.hold(b, "base", base)
	o := cachedOptions(1<<12, 16)
	o.ChunkTokens, o.MaxBatchTokens = 128, 256
	run := func(b *testing.B, k int, pull bool) {
		o := o
		o.PeerPullVerifyBlocks = k
		var checked uint64
		for i := range b.N {
			b.StopTimer()
			w := newPuller(b, newEngine(b), o, true)
			b.StartTimer()
			peer := h.peer(512)
			if !pull {
				peer = nil
			}
			_, got := generatePeer(b, w, fmt.Sprint("r", i), base, 1, peer)
			b.StopTimer()
			if pull && got.peer != 512 {
				b.Fatalf("pulled %d tokens, want 512", got.peer)
			}
			checked += w.s.Stats().PrefixCache.Peer.CheckTokens
			b.StartTimer()
		}
		b.ReportMetric(float64(checked)/float64(b.N), "checked-tokens/op")
	}
	b.Run("compute", func(b *testing.B) { run(b, 0, false) })
	for _, k := range []int{0, 1, 4} {
		b.Run(fmt.Sprintf("pull/k=%d", k), func(b *testing.B) { run(b, k, true) })
	}
}
