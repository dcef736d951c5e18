package prefill

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestDiskTierBadFileRecomputed: a prompt whose prefix the disk tier
// holds in a file that is no longer what the tier wrote (noise of the
// same size, or a FIFO in its place) is computed: the first token and
// every KV byte sent are the engine's without a cache, no disk hit is
// reported, and the bad entry is dropped and counted. Before, the noise
// was imported as the prefix's KV (a 200 with wrong text upstream), and
// the FIFO hung the scheduler, its read under the engine lock, until a
// writer came: this test then times out.
func TestDiskTierBadFileRecomputed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, path string)
	}{
		{"noise", func(t *testing.T, path string) {
			info, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			noise := make([]byte, info.Size())
			rng := rand.New(rand.NewPCG(3, 4))
			for i := range noise {
				noise[i] = byte(rng.Uint32())
			}
			if err := os.WriteFile(path, noise, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeReceiver{}
			addr := serveReceiver(t, f)
			o := hostOptions(int64(64 * newEngine(t).Spec().KVBytesPerToken()))
			o.PrefixCache.DiskDir, o.PrefixCache.DiskBytes = t.TempDir(), 1<<30
			w := newWorker(t, o, true)
			base := prompt(70, 3)
			prefillOne(t, w, f, addr, "base", base, 0)
			for j := range 2 {
				// base's blocks go to the host tier, then to disk.
				prefillOne(t, w, f, addr, fmt.Sprintf("x%d", j), prompt(40, int32(20+j)), 0)
			}
			files, _ := filepath.Glob(filepath.Join(w.s.cache.Host().Disk().Dir(), "*.kv"))
			if len(files) != 1 {
				t.Fatalf("disk tier files %v, want base's", files)
			}
			tc.spoil(t, files[0])
			p := sharing(base, 60, 48, 5)
			// prefillOne checks the first token and the KV against the
			// engine alone.
			ev, _ := prefillOne(t, w, f, addr, "again", p, 0)
			if ev.first.GetHit().GetDiskTokens() != 0 || ev.first.GetHit().GetTokens() != 0 {
				t.Errorf("prefix_hit_tokens %d, disk_hit_tokens %d from a bad file; want 0 (computed)",
					ev.first.GetHit().GetTokens(), ev.first.GetHit().GetDiskTokens())
			}
			if st := w.s.Stats().PrefixCache.Disk; st.BadEntries != 1 || st.Hits != 0 || st.Entries != 0 {
				t.Errorf("disk tier %+v: want one bad entry, dropped, and no hit", st)
			}
		})
	}
}
