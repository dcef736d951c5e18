package prefixcache_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// onDisk returns a cache over eng whose disk tier holds the entries of
// base and twin (prompts of 70 tokens, four blocks each: files of the
// same size), the two files, and base's.
func onDisk(t *testing.T, eng engine.Engine) (c *prefixcache.Cache, base []int32, baseFile, twinFile string) {
	t.Helper()
	c, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 12, MaxEntries: 1, BlockTokens: 16,
		HostBytes: int64(64 * eng.Spec().KVBytesPerToken()), DiskDir: t.TempDir(), DiskBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	base = tokens(nil, 70, 0, 1, 250)
	twin := tokens(nil, 70, 0, 5, 250)
	dir := c.Host().Disk().Dir()
	for i, p := range [][]int32{base, twin, tokens(nil, 40, 0, 2, 250), tokens(nil, 40, 0, 3, 250)} {
		seq := engine.SeqID(i + 1)
		run(t, eng, seq, p, 0, 0)
		if err := c.Free(eng, c.Insert(seq, c.Hashes(0, p), len(p))); err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			// base went down to disk: it is the only file.
			files, _ := filepath.Glob(filepath.Join(dir, "*.kv"))
			if len(files) != 1 {
				t.Fatalf("disk tier holds %v, want base's file", files)
			}
			baseFile = files[0]
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.kv"))
	for _, f := range files {
		if f != baseFile {
			twinFile = f
		}
	}
	if st := c.Stats().Disk; st.Entries != 2 || twinFile == "" {
		t.Fatalf("disk tier %+v, files %v: want base's and twin's", st, files)
	}
	return c, base, baseFile, twinFile
}

// TestDiskTierBadFiles: a disk-tier file that is not what the tier wrote
// (noise of the same size, a flipped bit, a truncated file, another
// entry's file of the same size, a FIFO, a symbolic link to a good copy,
// a directory) is never imported: ReadDisk returns nothing at once, the
// entry is dropped and counted, its file removed, and the prompt's prefix
// is computed (no tier holds it deeper than the engine). An intact file
// loads. Before the checksum, noise and the other entry's file were
// imported as the prefix's KV, and the FIFO blocked the read (under the
// worker's engine lock) until a writer came.
func TestDiskTierBadFiles(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	overwrite := func(f func(path string, data []byte) []byte) func(*testing.T, string, string) {
		return func(t *testing.T, path, _ string) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, f(path, data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	replace := func(f func(t *testing.T, path string)) func(*testing.T, string, string) {
		return func(t *testing.T, path, _ string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			f(t, path)
		}
	}
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, path, twin string)
	}{
		{"intact", func(*testing.T, string, string) {}},
		{"noise of the same size", overwrite(func(_ string, data []byte) []byte {
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			return data
		})},
		{"one bit flipped in the KV", overwrite(func(_ string, data []byte) []byte {
			data[len(data)-1] ^= 1
			return data
		})},
		{"truncated", overwrite(func(_ string, data []byte) []byte { return data[:len(data)-1] })},
		{"one byte more", overwrite(func(_ string, data []byte) []byte { return append(data, 0) })},
		{"another entry's file", func(t *testing.T, path, twin string) {
			data, err := os.ReadFile(twin)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"a FIFO", replace(func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		})},
		{"a symbolic link to an intact copy", func(t *testing.T, path, _ string) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cp := filepath.Join(t.TempDir(), "copy.kv")
			if err := os.WriteFile(cp, data, 0o600); err != nil {
				t.Fatal(err)
			}
			replace(func(t *testing.T, path string) {
				if err := os.Symlink(cp, path); err != nil {
					t.Fatal(err)
				}
			})(t, path, "")
		}},
		{"a directory", replace(func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, base, file, twin := onDisk(t, eng)
			defer func() { _ = c.Free(eng, c.Drain()) }()
			tc.spoil(t, file, twin)
			p := tokens(base, 60, 48, 9, 250)
			hashes, maxHit := c.Hashes(0, p), c.MaxHitBlocks(len(p))
			r := c.ReadDisk(context.Background(), hashes, maxHit)
			st := c.Stats().Disk
			if tc.name == "intact" {
				ld, err := c.Host().Load(eng, 100, hashes, maxHit, r)
				if err != nil || ld.Tokens != 48 || !ld.Disk || st.BadEntries != 0 {
					t.Fatalf("intact file: load %+v, %v, bad entries %d; want 48 tokens from disk", ld, err, st.BadEntries)
				}
				matchesCold(t, eng, 100, 101, p, ld.Tokens, true, "a disk load")
				return
			}
			if r != nil || st.BadEntries != 1 || st.Entries != 1 || st.Hits != 0 {
				t.Errorf("ReadDisk = %v; disk tier %+v: want nothing read, one bad entry dropped, twin's left", r != nil, st)
			}
			if _, err := os.Lstat(file); !os.IsNotExist(err) {
				t.Errorf("bad file after the read: %v, want it removed", err)
			}
			if c.HostDeeper(hashes, maxHit, r) {
				t.Error("HostDeeper = true after the bad entry was dropped: want the prefix computed")
			}
			ld, err := c.Host().Load(eng, 100, hashes, maxHit, r)
			if err != nil || ld.Tokens != 0 {
				t.Errorf("Load = %+v, %v; want a miss", ld, err)
			}
			// The twin's entry is intact.
			if r := c.ReadDisk(context.Background(), c.Hashes(0, tokens(nil, 70, 0, 5, 250)), 4); r == nil {
				t.Error("the intact twin entry was not read")
			}
		})
	}
}

// TestDiskTierFileFormat: an entry's file starts with its header (the
// format's magic), and the KV follows it unchanged; a file that only
// changes in the header's checksum field fails.
func TestDiskTierFileFormat(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	c, base, file, _ := onDisk(t, eng)
	defer func() { _ = c.Free(eng, c.Drain()) }()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	run(t, eng, 50, base, 0, 0)
	var kv []byte
	for l := range eng.Spec().Layers {
		b, err := eng.ExportKV(50, l, 0, 64, nil)
		if err != nil {
			t.Fatal(err)
		}
		kv = append(kv, b...)
	}
	if !bytes.HasPrefix(data, []byte("PDKVc32\x00")) || !bytes.Equal(data[len(data)-len(kv):], kv) || len(data)-len(kv) != 36 {
		t.Fatalf("file of %d bytes: want a 36-byte header then the %d bytes of KV", len(data), len(kv))
	}
	data[32] ^= 0xff
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := c.ReadDisk(context.Background(), c.Hashes(0, base), 4); r != nil || c.Stats().Disk.BadEntries != 1 {
		t.Errorf("a wrong checksum field: read %v, %+v; want a bad entry", r != nil, c.Stats().Disk)
	}
}
