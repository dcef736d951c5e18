package adversarial

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// TestDiskTierTamper: a prefill worker's disk-tier file replaced by
// noise of the same size, or by a FIFO, while its prompt's prefix is
// cached only there. The same greedy request afterwards gets the text it
// got before, with no disk hit, and the bad entry is counted; the worker
// does not hang. Before the checksum the noise was imported as the
// prefix's KV (200, disk_prefix_hit_tokens 208, wrong text), and the
// FIFO hung the prefill worker (its read under the engine lock) until a
// writer came: /metrics and heartbeats stopped.
func TestDiskTierTamper(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	perToken := int64(eng.Spec().KVBytesPerToken())
	eng.Close()
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
			rng := rand.New(rand.NewPCG(5, 6))
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
			dir := t.TempDir()
			d := startWorkers(t, nil, nil, func(wo *workerrun.Options) {
				if wo.Role != control.RolePrefill {
					return
				}
				// One prompt in engine memory, one on the host: the
				// third pushes the first down to disk.
				pc := &wo.Prefill.PrefixCache
				pc.MaxTokens, pc.MaxEntries = 1<<10, 1
				pc.HostBytes = 300 * perToken
				pc.DiskDir, pc.DiskBytes = dir, 1<<30
			})
			complete := func(prompt string) (text string, diskHit int) {
				t.Helper()
				body := fmt.Sprintf(`{"prompt":%q,"max_tokens":8,"temperature":0}`, prompt)
				r := d.post(t, frontend.RouteCompletions, "", strings.NewReader(body))
				if r.status != 200 {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				var resp struct {
					Choices []struct{ Text string }
					Pdserve struct {
						DiskHit int `json:"disk_prefix_hit_tokens"`
					}
				}
				if err := json.Unmarshal([]byte(r.body), &resp); err != nil || len(resp.Choices) != 1 {
					t.Fatalf("response %s: %v", r.body, err)
				}
				return resp.Choices[0].Text, resp.Pdserve.DiskHit
			}
			secret := "CONFIDENTIAL tenant A: the merger with Globex closes on 2027-03-14 at 41.50 USD a share, " +
				"and nobody outside the board may know it before the announcement."
			want, _ := complete(secret)
			complete(strings.Repeat("an unrelated prompt that fills engine memory; ", 4))
			complete(strings.Repeat("another unrelated prompt, for the host tier; ", 4))
			files, _ := filepath.Glob(filepath.Join(dir, "*", "*.kv"))
			if len(files) != 1 {
				t.Fatalf("disk tier files %v, want the secret prompt's", files)
			}
			tc.spoil(t, files[0])
			got, diskHit := complete(secret)
			if got != want || diskHit != 0 {
				t.Errorf("after the %s: text %q with disk_prefix_hit_tokens %d; want %q computed again", tc.name, got, diskHit, want)
			}
			if n := counter(t, d.Registry(), "pdserve_prefill_prefix_cache_tier_bad_entries_total"); n != 1 {
				t.Errorf("bad disk entries counted %v, want 1", n)
			}
		})
	}
}
