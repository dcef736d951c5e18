package prefixcache

import (
	"os"
	"testing"
	"testing/fstest"
)

func TestCgroupRoom(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		room  int64
		ok    bool
	}{
		{"v2 limit, namespaced path", fstest.MapFS{
			"proc/self/cgroup":             file("0::/\n"),
			"sys/fs/cgroup/memory.max":     file("8589934592\n"),
			"sys/fs/cgroup/memory.current": file("1073741824\n"),
		}, 7 << 30, true},
		{"v2 limit, host path", fstest.MapFS{
			"proc/self/cgroup":                              file("0::/kubepods/pod1/c1\n"),
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max":     file("1000\n"),
			"sys/fs/cgroup/kubepods/pod1/c1/memory.current": file("400\n"),
			"sys/fs/cgroup/memory.max":                      file("max\n"),
			"sys/fs/cgroup/memory.current":                  file("5\n"),
		}, 600, true},
		{"v2 path not under the mount: its root", fstest.MapFS{
			"proc/self/cgroup":             file("0::/elsewhere\n"),
			"sys/fs/cgroup/memory.max":     file("1000\n"),
			"sys/fs/cgroup/memory.current": file("1500\n"),
		}, 0, true},
		{"v2 no limit", fstest.MapFS{
			"proc/self/cgroup":             file("0::/\n"),
			"sys/fs/cgroup/memory.max":     file("max\n"),
			"sys/fs/cgroup/memory.current": file("5\n"),
		}, 0, false},
		{"v1 limit", fstest.MapFS{
			"proc/self/cgroup": file("9:name=systemd:/\n4:memory:/a/b\n0::/\n"),
			"sys/fs/cgroup/memory/a/b/memory.limit_in_bytes": file("4096\n"),
			"sys/fs/cgroup/memory/a/b/memory.usage_in_bytes": file("1024\n"),
		}, 3072, true},
		{"v1 no limit", fstest.MapFS{
			"proc/self/cgroup":                           file("4:cpu,memory:/\n"),
			"sys/fs/cgroup/memory/memory.limit_in_bytes": file("9223372036854771712\n"),
			"sys/fs/cgroup/memory/memory.usage_in_bytes": file("1024\n"),
		}, 0, false},
		{"no cgroup file", fstest.MapFS{}, 0, false},
	} {
		room, ok := cgroupRoom(tc.files)
		if room != tc.room || ok != tc.ok {
			t.Errorf("%s: cgroupRoom = %d, %v; want %d, %v", tc.name, room, ok, tc.room, tc.ok)
		}
	}
}

// TestFreeMemory checks FreeMemory against live readings of MemAvailable
// and the cgroup's room. Those change while other processes run, so a
// reading taken before or after FreeMemory's own may differ from it: the
// test compares FreeMemory only with readings that were the same just
// before and just after the call (the kernel folds its counters in steps,
// so readings microseconds apart mostly agree), and retries until it has
// such a steady pair. FreeMemory is a function of those readings, so a
// wrong one disagrees on every steady pair and the test fails; a reading
// that moved and came back within the call disagrees once and is retried.
func TestFreeMemory(t *testing.T) {
	type reading struct {
		avail, room int64
		limited     bool
	}
	read := func() reading {
		avail, err := MemAvailable()
		if err != nil {
			t.Skipf("no MemAvailable: %v", err)
		}
		room, ok := cgroupRoom(os.DirFS("/"))
		return reading{avail, room, ok}
	}
	const tries, maxMiss = 1000, 3
	miss := 0
	for range tries {
		before := read()
		free, err := FreeMemory()
		after := read()
		if err != nil {
			t.Fatalf("FreeMemory: %v", err)
		}
		if before != after {
			continue
		}
		want := before.avail
		if before.limited && before.room < want {
			want = before.room
		}
		if free == want {
			return
		}
		t.Logf("FreeMemory = %d; want %d (MemAvailable %d, cgroup room %d, limited %v, steady across the call)",
			free, want, before.avail, before.room, before.limited)
		if miss++; miss == maxMiss {
			break
		}
	}
	if miss > 0 {
		t.Fatalf("FreeMemory disagreed with %d steady readings and agreed with none", miss)
	}
	t.Skipf("memory readings never steady across a FreeMemory call in %d tries", tries)
}
