package workerrun

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
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
	o.KVEvents = false // heartbeats carry the digest only then
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
		generateOne(b, client, fmt.Sprint("digest-", i), p)
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

// BenchmarkKVEventStaleness measures how stale the coordinator's KV-event
// index gets: the time from the end of a request (its prompt enters the
// decode worker's prefix cache) to the index holding the prompt's last
// block, with the default flush interval (50 ms) and KV events over a
// local NATS server. Each request starts after a random pause of 0-50 ms,
// so that its end falls at a random phase of the flush ticker. Reported
// as p50-ms, p99-ms and max-ms over the requests; the bound is one flush
// interval plus the NATS hop.
//
//	go test -run '^$' -bench KVEventStaleness -benchtime 200x ./pkg/workerrun/
func BenchmarkKVEventStaleness(b *testing.B) {
	url := startNATS(b)
	o := testOptions(control.RoleColocated, url)
	o.ID = "colocated-kvstale"
	o.Decode.KVBlocks = 512
	o.Decode.PrefixCache.MaxTokens = 4096
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	ix := control.NewKVIndex(control.DefaultKVIndexMaxBlocks, nil)
	// Watching before the worker starts: the index takes the worker's
	// start snapshot (a coordinator started later asks for one).
	stop, err := control.WatchKV(context.Background(), nc, ix, control.NewMembership(time.Minute), time.Hour, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	w := startWorker(b, o)
	client := pdservev1.NewDecodeServiceClient(dial(b, w))
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range b.N {
		time.Sleep(time.Duration(rng.Int64N(int64(50 * time.Millisecond))))
		p := prompt(48, int32(1000+i))
		hs := kv.HashBlocks(0, p, o.Decode.BlockTokens)
		last := uint64(hs[len(hs)-1])
		generateOne(b, client, fmt.Sprint("kvstale-", i), p)
		done := time.Now()
		deadline := done.Add(10 * time.Second)
		for {
			if v := ix.Blocks(o.ID); v != nil && v.Has(last) {
				lat = append(lat, time.Since(done))
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("request %d: its blocks not indexed after 10 s", i)
			}
			time.Sleep(100 * time.Microsecond) // polling the index is the measurement
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(f float64) float64 {
		return float64(lat[min(int(f*float64(len(lat))), len(lat)-1)].Microseconds()) / 1e3
	}
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
}

// generateOne serves p as request id on a colocated worker, one token, and
// returns once its stream ended (its prompt then enters the prefix cache).
func generateOne(b *testing.B, client pdservev1.DecodeServiceClient, id string, p []int32) {
	b.Helper()
	stream, err := client.Generate(testCtx(b), &pdservev1.GenerateRequest{RequestId: id,
		PromptTokens: p, MaxTokens: 1, LocalPrefill: true, IgnoreEos: true})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := readGenerate(stream, 0); err != nil {
		b.Fatal(err)
	}
}
