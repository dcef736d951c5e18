package ref_test

import (
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/enginetest"
	"github.com/pdserve/pdserve/pkg/engine/ref"
)

// newTiny returns a tiny-preset engine closed when t ends.
func newTiny(t testing.TB, threads int) *ref.Engine {
	t.Helper()
	e, err := ref.New(ref.Options{Preset: "tiny", Seed: 1, Threads: threads})
	if err != nil {
		t.Fatalf("ref.New: %v", err)
	}
	t.Cleanup(e.Close)
	return e
}

func TestConformance(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engine.Engine { return newTiny(t, 0) })
}
