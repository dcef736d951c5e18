package standalone_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/standalone"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// TestStartShutdown: Start brings up the workers of the options and a
// coordinator that becomes ready with them; Shutdown stops it all and
// repeats its result.
func TestStartShutdown(t *testing.T) {
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.Standalone = "127.0.0.1:0", true
	o.PrefillWorkers, o.DecodeWorkers = 1, 2
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	s, err := standalone.Start(context.Background(), o, zaptest.NewLogger(t),
		standalone.WithWorkerOptions(func(wo *workerrun.Options) { wo.HeartbeatInterval = 20 * time.Millisecond }))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, w := range s.Workers() {
		ids = append(ids, w.ID())
	}
	if want := []string{"prefill-0", "decode-0", "decode-1"}; len(ids) != len(want) || ids[0] != want[0] || ids[2] != want[2] {
		t.Errorf("workers = %v, want %v", ids, want)
	}
	poll.CheckFor(t, 10*time.Second, 10*time.Millisecond, s.Ready)
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown = %v", err)
	}
	if s.Ready() == nil {
		t.Error("ready after Shutdown")
	}
}

// TestStartModes: each package refuses the other's options.
func TestStartModes(t *testing.T) {
	o := coordinator.DefaultOptions()
	o.HTTPAddr = "127.0.0.1:0"
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if s, err := standalone.Start(context.Background(), o, nil); err == nil {
		_ = s.Shutdown(context.Background())
		t.Error("standalone.Start without Standalone succeeded")
	}
	o.Standalone = true
	if c, err := coordinator.Start(context.Background(), o, nil); !errors.Is(err, coordinator.ErrStandalone) {
		if c != nil {
			_ = c.Shutdown(context.Background())
		}
		t.Errorf("coordinator.Start with Standalone = %v, want ErrStandalone", err)
	}
}

// TestRunStoppedWhileStarting: a stop (ctx ended) that comes while
// Run is still starting is a clean stop, not a failure: Run returns nil
// and leaves nothing running. A SIGTERM in the first second of a pod
// made the coordinator exit 1 ("control: watch: context canceled").
func TestRunStoppedWhileStarting(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.Standalone = "127.0.0.1:0", true
	o.PrefillWorkers, o.DecodeWorkers = 1, 1
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := standalone.Run(ctx, o, zaptest.NewLogger(t)); err != nil {
		t.Errorf("Run stopped while starting = %v, want nil", err)
	}
}
