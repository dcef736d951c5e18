package prefixcache

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestStaleDiskTiersRemoved: a new disk tier removes the directories of
// tiers whose process is gone (their lock file not held, or no lock file
// and old) and keeps a live tier's, a young unlocked one and anything
// that is not a tier's.
func TestStaleDiskTiersRemoved(t *testing.T) {
	dir := t.TempDir()
	live, err := newDisk(dir, 1<<20, 16)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(name string, lock bool, age time.Duration) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "0.kv"), []byte("kv"), 0o600); err != nil {
			t.Fatal(err)
		}
		if lock {
			if err := os.WriteFile(p+lockSuffix, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		old := time.Now().Add(-age)
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dead := mk(diskDirPrefix+"dead", true, 0)
	oldNoLock := mk(diskDirPrefix+"old", false, 2*staleUnlocked)
	youngNoLock := mk(diskDirPrefix+"young", false, 0)
	other := mk("models", false, 2*staleUnlocked)

	next, err := newDisk(dir, 1<<20, 16)
	if err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	for p, want := range map[string]bool{dead: false, oldNoLock: false, youngNoLock: true, other: true, live.Dir(): true, next.Dir(): true} {
		if exists(p) != want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(p), !want, want)
		}
	}
	// A tier that ends removes its directory and gives up its lock; one
	// that is gone without clear (its lock closed, as at a process's
	// death) is removed by the next tier.
	if err := live.clear(); err != nil || exists(live.Dir()) || exists(live.Dir()+lockSuffix) {
		t.Errorf("clear: %v, directory still there: %v, lock file: %v", err, exists(live.Dir()), exists(live.Dir()+lockSuffix))
	}
	next.lock.Close()
	if _, err := newDisk(dir, 1<<20, 16); err != nil {
		t.Fatal(err)
	}
	if exists(next.Dir()) || exists(next.Dir()+lockSuffix) {
		t.Errorf("a tier whose lock is released was not removed (directory %v, lock file %v)", exists(next.Dir()), exists(next.Dir()+lockSuffix))
	}
	if exists(dead + lockSuffix) {
		t.Errorf("a dead tier's lock file was left")
	}
}
