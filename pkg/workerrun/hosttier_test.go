package workerrun

import (
	"context"
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

// TestKVEventsHostTier: the blocks a worker's engine tier evicts to its
// host tier reach a coordinator's index as the host tier's view, equal to
// the host tier, apart from the engine tier's.
func TestKVEventsHostTier(t *testing.T) {
	url := startNATS(t)
	o := testOptions(control.RoleColocated, url)
	o.ID = "colocated-host"
	o.Decode.PrefixCache.MaxTokens = 160 // three 49-token prompts: later ones evict
	o.Decode.PrefixCache.HostBytes = 1 << 30
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
	client := pdservev1.NewDecodeServiceClient(dial(t, w))
	var all []uint64
	for i := range 8 {
		p := prompt(48, int32(200+i))
		for _, h := range kv.HashBlocks(0, p, o.Decode.BlockTokens) {
			all = append(all, uint64(h))
		}
		stream, err := client.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: fmt.Sprint("host-", i),
			PromptTokens: p, MaxTokens: 1, LocalPrefill: true, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := readGenerate(stream, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := w.svc.(decodeService).Stats().PrefixCache; st.Host.Spills == 0 {
		t.Fatalf("cache stats %+v: want spills to the host tier", st)
	}
	view := func(v *control.WorkerBlocks) []uint64 {
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
	held := func() []uint64 {
		hs := w.svc.hostBlocks().AppendBlocks(nil, nil)
		slices.Sort(hs)
		return hs
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if h, i := held(), view(ix.HostBlocks(o.ID)); len(h) == 0 || !slices.Equal(h, i) {
			return fmt.Errorf("host tier index %x, host tier %x", i, h)
		}
		engine := w.svc.prefixBlocks().AppendBlocks(nil, nil)
		slices.Sort(engine)
		if i := view(ix.Blocks(o.ID)); !slices.Equal(engine, i) {
			return fmt.Errorf("engine tier index %x, engine tier %x", i, engine)
		}
		return nil
	})
}
