package kvtransfer

import (
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
)

// The link measured per address feeds the next choice: after a transfer
// that moved its bytes at 1 MB/s, the best-ratio lossless codec wins (it
// encodes far faster than that), and the reason says the link was
// measured; another address is still unmeasured. A transfer limited by
// the receiver's decoding or by the sender's encoding only raises the
// estimate.
func TestCodecChooserMeasuresLink(t *testing.T) {
	a := NewCodecChooser(engine.BF16)
	const slow = "10.0.0.1:1"
	ch, err := a.Start(slow, "none", 0)
	if err != nil || ch != (CodecChoice{Codec: "none"}) {
		t.Fatalf("start of a named codec: %+v, %v", ch, err)
	}
	a.Finish(slow, "none", 8<<20, 8<<20, 8<<20*time.Second/1e6, 0) // 1 MB/s
	if got, n := a.links.Throughput(slow); n != 1 || got < 0.99e6 || got > 1.01e6 {
		t.Fatalf("throughput %v over %d samples, want 1e6 over 1", got, n)
	}
	ch, err = a.Start(slow, codecpick.Auto, 100<<20)
	if err != nil {
		t.Fatal(err)
	}
	a.Finish(slow, "", 0, 0, 0, 0) // never opened: not a sample
	sp, _ := a.speeds()
	best := ""
	ratio := 0.0
	for _, c := range sp.Codecs {
		if c.Lossless && c.Ratio > ratio {
			best, ratio = c.Codec, c.Ratio
		}
	}
	if ch.Codec != best || !strings.Contains(ch.Reason, "measured") || strings.Contains(ch.Reason, "assumed") {
		t.Errorf("on a 1 MB/s link: %+v, want %s (ratio %.3g) for a measured link", ch, best, ratio)
	}
	if _, n := a.links.Throughput(slow); n != 1 {
		t.Errorf("a transfer that never opened counted: %d samples", n)
	}
	ch, err = a.Start("10.0.0.2:1", codecpick.Auto, 100<<20)
	if err != nil || !strings.Contains(ch.Reason, "assumed") {
		t.Errorf("unmeasured address: %+v, %v", ch, err)
	}
	a.Finish("10.0.0.2:1", ch.Codec, 0, 0, 0, 0)

	// A receiver that decodes bf16 at 2 MB/s: a bf16 transfer at 1.9 MB/s
	// raw was decode-bound, so its lower wire rate does not lower the link.
	a.SetReceivers(func(string) (ReceiverSpeeds, bool) {
		return ReceiverSpeeds{DecodeBytesPerSec: map[string]float64{"bf16": 2e6}}, true
	})
	if _, err := a.Start(slow, "bf16", 0); err != nil {
		t.Fatal(err)
	}
	// 0.5 MB/s on the wire: a link sample below the estimate, which only
	// the decode-bound rule keeps from lowering it.
	a.Finish(slow, "bf16", 1.9e6*8, 0.5e6*8, 8*time.Second, 0)
	if got, n := a.links.Throughput(slow); n != 2 || got < 0.99e6 {
		t.Errorf("after a decode-bound transfer: %v over %d samples, want ≥ 1e6 over 2", got, n)
	}
	// A transfer that spent 7 of its 8 s encoding was encode-bound: its
	// 0.5 MB/s on the wire does not lower the link either.
	if _, err := a.Start(slow, "zstd", 0); err != nil {
		t.Fatal(err)
	}
	a.Finish(slow, "zstd", 4e6, 4e6, 8*time.Second, 7*time.Second)
	if got, n := a.links.Throughput(slow); n != 3 || got < 0.99e6 {
		t.Errorf("after an encode-bound transfer: %v over %d samples, want ≥ 1e6 over 3", got, n)
	}
	// The same transfer with little encoding time was link-bound: it does.
	if _, err := a.Start(slow, "zstd", 0); err != nil {
		t.Fatal(err)
	}
	a.Finish(slow, "zstd", 4e6, 4e6, 8*time.Second, time.Second)
	if got, n := a.links.Throughput(slow); n != 4 || got >= 0.99e6 {
		t.Errorf("after a link-bound slow transfer: %v over %d samples, want below 1e6 over 4", got, n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.total != 0 || len(a.inflight) != 0 {
		t.Errorf("transfers still counted: %d, %v", a.total, a.inflight)
	}
}
