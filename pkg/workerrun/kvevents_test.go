package workerrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/kv"
)

// TestKVEventsIndexEqualsCache: a worker's KV events keep a coordinator's
// index equal to its prefix cache through inserts and evictions; a
// snapshot command is answered; heartbeats carry no digest meanwhile.
func TestKVEventsIndexEqualsCache(t *testing.T) {
	url := startNATS(t)
	o := testOptions(control.RoleColocated, url)
	o.ID = "colocated-kv"
	o.Decode.PrefixCache.MaxTokens = 160 // three 49-token prompts: later ones evict
	w := startWorker(t, o)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ix := control.NewKVIndex(control.DefaultKVIndexMaxBlocks, nil)
	stop, err := control.WatchKV(context.Background(), nc, ix, control.NewMembership(time.Minute), time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	digests := make(chan int, 64)
	sub, err := nc.Subscribe(control.HeartbeatSubject(string(o.Role), o.ID), func(m *nats.Msg) {
		var hb control.Heartbeat
		if json.Unmarshal(m.Data, &hb) == nil {
			select {
			case digests <- len(hb.PrefixDigest):
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	all := prefillLocal(t, w, o, "kv-", 100)
	dec := w.cur().svc.(decodeService)
	if st := dec.Stats().PrefixCache; st.Inserts < 8 || st.Evictions == 0 {
		t.Fatalf("cache stats %+v: want 8 inserts and evictions", st)
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if c, i := sortedBlocks(w.cur().svc.prefixBlocks()), indexed(ix.Blocks(o.ID), all); len(c) == 0 || !slices.Equal(c, i) {
			return fmt.Errorf("index %x, cache %x", i, c)
		}
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := control.SendCommand(ctx, nc, string(o.Role), o.ID, control.Command{Kind: control.CmdKVSnapshot}); err != nil {
		t.Fatalf("kv snapshot command: %v", err)
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if st := ix.Blocks(o.ID).State(); st.Snapshots < 2 || st.Stale {
			return fmt.Errorf("state %+v: want the start snapshot and the commanded one", st)
		}
		return nil
	})
	if n := <-digests; n != 0 {
		t.Errorf("a heartbeat carries a %d-hash digest beside KV events", n)
	}
}

// prefillLocal prefills eight 48-token prompts of seeds seed… on
// colocated worker w (local prefill, one token each), request ids tag…,
// and returns their block hashes.
func prefillLocal(t *testing.T, w *Worker, o Options, tag string, seed int32) []uint64 {
	t.Helper()
	client := pdservev1.NewDecodeServiceClient(dial(t, w))
	var all []uint64
	for i := range 8 {
		p := prompt(48, seed+int32(i))
		for _, h := range kv.HashBlocks(0, p, o.Decode.BlockTokens) {
			all = append(all, uint64(h))
		}
		stream, err := client.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: fmt.Sprint(tag, i),
			PromptTokens: p, MaxTokens: 1, LocalPrefill: true, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := readGenerate(stream, 0); err != nil {
			t.Fatal(err)
		}
	}
	return all
}

// sortedBlocks returns the block hashes b holds, sorted.
func sortedBlocks(b interface {
	AppendBlocks([]uint64, func()) []uint64
}) []uint64 {
	hs := b.AppendBlocks(nil, nil)
	slices.Sort(hs)
	return hs
}

// indexed returns the hashes of all that v (nil: none) holds, sorted.
func indexed(v *control.WorkerBlocks, all []uint64) []uint64 {
	if v == nil {
		return nil
	}
	var out []uint64
	for _, h := range all {
		if v.Has(h) {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out
}

// TestKVEventsOff: without --kv-events the heartbeats carry the digest and
// a snapshot command fails.
func TestKVEventsOff(t *testing.T) {
	url := startNATS(t)
	o := testOptions(control.RoleColocated, url)
	o.ID = "colocated-nokv"
	o.KVEvents = false
	o.Decode.PrefixCache.MaxTokens = 160
	w := startWorker(t, o)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	client := pdservev1.NewDecodeServiceClient(dial(t, w))
	stream, err := client.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: "nokv",
		PromptTokens: prompt(48, 1), MaxTokens: 1, LocalPrefill: true, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readGenerate(stream, 0); err != nil {
		t.Fatal(err)
	}
	if w.heartbeat().PrefixDigest == nil {
		t.Error("no digest in the heartbeat without KV events")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := control.SendCommand(ctx, nc, string(o.Role), o.ID, control.Command{Kind: control.CmdKVSnapshot}); !errors.Is(err, control.ErrCommandFailed) {
		t.Errorf("kv snapshot command without KV events: %v, want ErrCommandFailed", err)
	}
}
