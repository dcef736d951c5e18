package prefixcache

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
)

// FreeMemory returns the memory this process may still use, in bytes: the
// host's MemAvailable, or less when the process's memory cgroup (a
// container's limit: a pod's resources.limits.memory) leaves less, its
// limit minus its usage. A worker sizes an auto host tier by it, so that
// a pod on a large node does not take a share of the node's RAM its
// limit does not give it. Errors: no readable MemAvailable.
func FreeMemory() (int64, error) {
	free, err := MemAvailable()
	if err != nil {
		return 0, err
	}
	if room, ok := cgroupRoom(os.DirFS("/")); ok && room < free {
		free = room
	}
	return free, nil
}

// AutoHostBytes returns the size of an auto host tier (Options.HostBytes
// Auto) for a process with one: FreeMemory divided by HostAutoDivisor.
// Errors: FreeMemory's.
func AutoHostBytes() (int64, error) {
	free, err := FreeMemory()
	if err != nil {
		return 0, err
	}
	return free / HostAutoDivisor, nil
}

// cgroupRoom returns limit minus usage of the memory cgroup of this
// process, read from root (the file system's root): cgroup v2's
// memory.max and memory.current, or v1's memory.limit_in_bytes and
// memory.usage_in_bytes. ok is false when there is no limit or it cannot
// be read. A cgroup path that is not under the mount (a container with
// the host's view of /proc/self/cgroup) falls back to the mount's root,
// which is the container's own cgroup there.
func cgroupRoom(root fs.FS) (room int64, ok bool) {
	data, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		var dir, limitFile, usageFile string
		switch {
		case f[0] == "0" && f[1] == "":
			dir, limitFile, usageFile = "sys/fs/cgroup", "memory.max", "memory.current"
		case hasController(f[1], "memory"):
			dir, limitFile, usageFile = "sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
		default:
			continue
		}
		for _, d := range []string{path.Join(dir, f[2]), dir} {
			limit, lok := readBytes(root, path.Join(d, limitFile))
			usage, uok := readBytes(root, path.Join(d, usageFile))
			if lok && uok {
				return max(limit-usage, 0), true
			}
		}
	}
	return 0, false
}

// unlimited is the smallest value cgroup v1 reports for no limit (the
// largest page-aligned int64); v2 writes "max".
const unlimited = 1 << 62

// readBytes reads one number of bytes from name; ok is false when it is
// unreadable, "max" or the v1 no-limit value.
func readBytes(root fs.FS, name string) (int64, bool) {
	data, err := fs.ReadFile(root, name)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || n >= unlimited {
		return 0, false
	}
	return n, true
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}
