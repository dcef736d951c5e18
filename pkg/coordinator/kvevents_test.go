package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/router"
)

// TestRouterSeesEveryCachedBlock: a prefill worker whose cache holds
// 6000 blocks, beyond the 4096 a heartbeat digest carries, publishes them
// as KV events over a real NATS server; the coordinator's index takes
// them, the router predicts a prompt's hit at block 5001 in full there,
// a worker without events still routes on its digest, and a worker that
// leaves the membership loses its view.
func TestRouterSeesEveryCachedBlock(t *testing.T) {
	s, url, err := control.StartEmbedded("127.0.0.1:-1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s.Shutdown()
		s.WaitForShutdown()
	}()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	const held = 6000
	bt := prefixcache.DefaultBlockTokens
	seq := make([]int32, held*bt)
	for i := range seq {
		seq[i] = int32(i*7919) % 32000
	}
	chain := make([]uint64, held)
	for i, h := range kv.HashBlocks(0, seq, bt) {
		chain[i] = uint64(h)
	}
	members := control.NewMembership(time.Minute)
	now := time.Now()
	for _, hb := range []control.Heartbeat{
		{ID: "decode-0", Role: "decode", GRPCAddr: "10.0.0.1:1", KVBlocksFree: 1 << 20, KVBlocksTotal: 1 << 20},
		{ID: "prefill-0", Role: "prefill", GRPCAddr: "10.0.0.2:1", PrefixDigest: chain[:prefixcache.DefaultDigestHashes]},
		{ID: "prefill-1", Role: "prefill", GRPCAddr: "10.0.0.3:1"},
	} {
		if err := members.Observe(hb, now); err != nil {
			t.Fatal(err)
		}
	}
	ix := control.NewKVIndex(control.DefaultKVIndexMaxBlocks, nil)
	stop, err := control.WatchKV(context.Background(), nc, ix, members, 10*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	pub, err := control.NewKVPublisher(nc, "prefill", "prefill-1", control.DefaultKVOptions(), func(dst []uint64, mark func()) []uint64 {
		mark()
		return append(dst, chain...)
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = pub.Run(ctx) })
	defer func() {
		cancel()
		wg.Wait()
	}()
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if v := ix.Blocks("prefill-1"); v == nil || v.State().Blocks != held {
			return errors.New("prefill-1's snapshot not indexed")
		}
		return nil
	})

	o := DefaultOptions()
	b := &backend{members: members, router: newRouter(o, nil), kv: ix, prefixBlockTokens: bt}
	prefills := b.workers(control.RolePrefill)
	for _, w := range prefills {
		if (w.Prefix != nil) != (w.ID == "prefill-1") {
			t.Errorf("%s: index view %v; want one for prefill-1 only (prefill-0 sends no events)", w.ID, w.Prefix != nil)
		}
	}
	const hit = 5001
	req := router.Request{ID: "r", PromptTokens: hit*bt + 8, MaxTokens: 1, PrefixHashes: chain[:hit]}
	dec, err := b.router.Route(now, req, b.workers(control.RoleDecode), prefills, nil)
	if err != nil {
		t.Fatal(err)
	}
	if dec.Prefill.ID != "prefill-1" || dec.PrefixHitTokens != hit*bt {
		t.Errorf("routed to %q with a predicted hit of %d tokens; want prefill-1 with all %d blocks (%d tokens)",
			dec.Prefill.ID, dec.PrefixHitTokens, hit, hit*bt)
	}
	b.router.Done("r")

	members.Remove("prefill-1")
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if ix.Blocks("prefill-1") != nil {
			return fmt.Errorf("prefill-1 left, its view is still there")
		}
		return nil
	})
}
