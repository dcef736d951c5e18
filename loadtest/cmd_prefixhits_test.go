package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/pkg/workload"
)

// fourRequests is a Mooncake trace of four prompts sharing blocks 1
// and 2 (ids name whole prefixes; only full 512-token blocks count).
const fourRequests = `{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2, 3]}
{"timestamp": 1, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2, 4]}
{"timestamp": 2, "input_length": 600, "output_length": 1, "hash_ids": [1, 5]}
{"timestamp": 3, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}
`

// TestPrefixHits: one tenant hits every earlier full block (the last
// prompt all but its last token); two tenants, round-robin, hit only
// their own requests' blocks; four hit nothing; a one-block cache keeps
// each chain's head (eviction takes the tail first).
func TestPrefixHits(t *testing.T) {
	rows, err := workload.ParseMooncake(strings.NewReader(fourRequests))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tenants  int
		capacity int64 // blocks; 0: unbounded
		hit      int64
	}{
		{1, 0, 1024 + 512 + 1023},
		{2, 0, 512 + 1023},
		{4, 0, 0},
		{1, 1, 512 + 512 + 512},
	} {
		got := prefixHits(rows, tc.tenants, tc.capacity, tc.capacity == 0)
		if got.hit != tc.hit || got.all != 3824 {
			t.Errorf("%d tenants, %d blocks: %+v, want %d of 3824 tokens hit", tc.tenants, tc.capacity, got, tc.hit)
		}
	}
}

func TestPrefixHitsCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(fourRequests), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errs strings.Builder
	if code := run([]string{"prefix-hits", "--dataset-path", path, "--tenants", "1,2"}, &out, &errs); code != exitOK {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	for _, want := range []string{"       1     0.6692", "       2     0.4014", "Mooncake, FAST 2025"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, bad := range [][]string{{"--tenants", "0"}, {"--cache-tokens", "-1"}, {}} {
		args := append([]string{"prefix-hits"}, bad...)
		if len(bad) > 0 {
			args = append(args, "--dataset-path", path)
		}
		if code := run(args, &out, &errs); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", bad, code, exitUsage)
		}
	}
}
