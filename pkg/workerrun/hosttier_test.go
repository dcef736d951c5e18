package workerrun

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
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
	all := prefillLocal(t, w, o, "host-", 200)
	if st := w.svc.(decodeService).Stats().PrefixCache; st.Host.Spills == 0 {
		t.Fatalf("cache stats %+v: want spills to the host tier", st)
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if h, i := sortedBlocks(w.svc.hostBlocks()), indexed(ix.HostBlocks(o.ID), all); len(h) == 0 || !slices.Equal(h, i) {
			return fmt.Errorf("host tier index %x, host tier %x", i, h)
		}
		engine := sortedBlocks(w.svc.prefixBlocks())
		if i := indexed(ix.Blocks(o.ID), all); !slices.Equal(engine, i) {
			return fmt.Errorf("engine tier index %x, engine tier %x", i, engine)
		}
		return nil
	})
}
