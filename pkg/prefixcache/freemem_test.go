package prefixcache

import (
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
	free, err := FreeMemory()
	if avail, aerr := MemAvailable(); aerr == nil && (err != nil || free <= 0 || free > avail) {
		t.Errorf("FreeMemory = %d, %v; want in (0, MemAvailable %d]", free, err, avail)
	}
}
