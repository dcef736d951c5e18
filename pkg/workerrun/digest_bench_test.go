package workerrun

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/kv"
)

// BenchmarkPrefixDigestStaleness measures how stale the prefix digest a
// coordinator routes on gets: the time from the end of a request (its
// prompt enters the decode worker's prefix cache) to the first heartbeat
// whose digest holds the prompt's first block, at the default heartbeat
// interval (1 s). Each request starts right after the heartbeat that
// showed the one before, so this is the worst phase: the figure
// approaches one interval, the bound. Reported as staleness-ms (mean per
// request) and digest-bytes (the JSON size of the last digest).
//
//	go test -run '^$' -bench PrefixDigestStaleness -benchtime 10x ./pkg/workerrun/
func BenchmarkPrefixDigestStaleness(b *testing.B) {
	url := startNATS(b)
	o := testOptions(control.RoleColocated, url)
	o.ID = "colocated-digest"
	o.HeartbeatInterval = NewDecodeOptions().HeartbeatInterval
	o.Decode.KVBlocks = 512
	o.Decode.PrefixCache.MaxTokens = 4096
	w := startWorker(b, o)
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	digests := make(chan []uint64, 16)
	sub, err := nc.Subscribe(control.HeartbeatSubject(string(control.RoleColocated), o.ID), func(m *nats.Msg) {
		var hb control.Heartbeat
		if json.Unmarshal(m.Data, &hb) == nil {
			select {
			case digests <- hb.PrefixDigest:
			default:
			}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	client := pdservev1.NewDecodeServiceClient(dial(b, w))
	var total time.Duration
	var last []uint64
	b.ResetTimer()
	for i := range b.N {
		p := prompt(48, int32(1000+i))
		first := uint64(kv.HashBlocks(0, p, o.Decode.BlockTokens)[0])
		stream, err := client.Generate(testCtx(b), &pdservev1.GenerateRequest{RequestId: fmt.Sprint("digest-", i),
			PromptTokens: p, MaxTokens: 1, LocalPrefill: true, IgnoreEos: true})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := readGenerate(stream, 0); err != nil {
			b.Fatal(err)
		}
		done := time.Now()
		for found := false; !found; {
			select {
			case d := <-digests:
				if slices.Contains(d, first) {
					found, last = true, d
					total += time.Since(done)
				}
			case <-time.After(10 * time.Second):
				b.Fatalf("request %d: no heartbeat's digest holds its prompt after 10 s", i)
			}
		}
	}
	b.StopTimer()
	data, _ := json.Marshal(last)
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "staleness-ms")
	b.ReportMetric(float64(len(data)), "digest-bytes")
}
