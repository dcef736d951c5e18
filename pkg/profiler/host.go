package profiler

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// HostInfo describes this machine: the CPU model from /proc/cpuinfo, the
// logical CPUs (its processor entries, whatever this process's affinity;
// else runtime.NumCPU), MemTotal from /proc/meminfo; threads is what the engine
// runs with. Fields it cannot read stay empty.
func HostInfo(threads int) perfmodel.Host {
	h := perfmodel.Host{LogicalCPUs: runtime.NumCPU(), Threads: threads, OS: runtime.GOOS, Arch: runtime.GOARCH}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		h.CPU = cpuModel(data)
		// The machine's CPUs, not this process's affinity (a profile is
		// measured pinned to the cores of one worker).
		if n := bytes.Count(data, []byte("\nprocessor")) + bytes.Count(data[:min(len(data), 9)], []byte("processor")); n > 0 {
			h.LogicalCPUs = n
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		h.MemoryBytes = memTotal(data)
	}
	return h
}

// cpuModel returns the first "model name" (x86) or "Model"/"Hardware"
// (Arm) line's value of /proc/cpuinfo.
func cpuModel(cpuinfo []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	var fallback string
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			return strings.Join(strings.Fields(v), " ")
		case "Model", "Hardware", "CPU part":
			if fallback == "" {
				fallback = strings.Join(strings.Fields(v), " ")
			}
		}
	}
	return fallback
}

// memTotal returns MemTotal of /proc/meminfo in bytes, 0 when absent.
func memTotal(meminfo []byte) int64 {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

// cudaGPU returns the NVIDIA GPU llama.cpp runs on when its library
// directory holds a CUDA backend (libggml-cuda*.so) and the driver lists a
// GPU under /proc/driver/nvidia/gpus (its "Model:" line; the first GPU,
// llama.cpp's main GPU by default). "" otherwise: a CPU build, or no GPU.
func cudaGPU(libDir string) string {
	if m, _ := filepath.Glob(filepath.Join(libDir, "libggml-cuda*.so*")); len(m) == 0 {
		return ""
	}
	infos, _ := filepath.Glob("/proc/driver/nvidia/gpus/*/information")
	if len(infos) == 0 {
		return ""
	}
	data, err := os.ReadFile(infos[0])
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "Model" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// slug turns a name into a profile name part: lower case, runs of other
// characters than letters, digits, '.' and '-' become one '-'.
func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.'
		switch {
		case ok:
			b.WriteRune(r)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.Trim(b.String(), "-.")
}
