package workerrun

import (
	"errors"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/engine"
)

// fixedEngine is a ref engine that reports a fixed KV capacity and whether
// its KV can move, as the llamacpp engine does.
type fixedEngine struct {
	engine.Engine
	tokens, seqs int
	transfer     error
}

func (f fixedEngine) KVCapacity() (int, int) { return f.tokens, f.seqs }
func (f fixedEngine) Transferable() error    { return f.transfer }

var errNoMove = errors.New("sliding-window cache")

// TestEngineCapacity: a decode pool larger than the engine's KV cache is
// fitted to it; a model whose KV cannot move starts colocated but not as a
// prefill or decode worker.
func TestEngineCapacity(t *testing.T) {
	nats := startNATS(t)
	o := testOptions(control.RoleDecode, nats)
	o.Decode.KVBlocks, o.Decode.BlockTokens, o.Decode.MaxBatch = 64, 16, 8
	o.EngineOverride = fixedEngine{Engine: newEngine(t), tokens: 160, seqs: 3}
	w := startWorker(t, o)
	if got := w.heartbeat().KVBlocksTotal; got != 10 {
		t.Errorf("pool of %d blocks on an engine of 160 tokens at 16 a block, want 10", got)
	}

	for _, tc := range []struct {
		role    control.Role
		wantErr bool
	}{
		{control.RolePrefill, true},
		{control.RoleDecode, true},
		{control.RoleColocated, false},
	} {
		t.Run(string(tc.role), func(t *testing.T) {
			o := testOptions(tc.role, nats)
			o.EngineOverride = fixedEngine{Engine: newEngine(t), tokens: 1 << 20, seqs: 64, transfer: errNoMove}
			if !tc.wantErr {
				startWorker(t, o)
				return
			}
			w, err := Start(testCtx(t), o, nil)
			if err == nil {
				w.Stop(testCtx(t))
				t.Fatal("a worker that moves KV started on an engine whose KV cannot move")
			}
			if !errors.Is(err, errNoMove) || !strings.Contains(err.Error(), "colocated") {
				t.Errorf("error %q: want the engine's reason and the advice to run colocated", err)
			}
		})
	}
}
