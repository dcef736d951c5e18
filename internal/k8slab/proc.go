package k8slab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one long-running component: a binary, its arguments, a pid file
// under run/ and a log file under logs/.
type proc struct {
	name string
	bin  string
	args []string
	env  []string
}

func (l *Lab) pidFile(name string) string { return l.p("run/" + name + ".pid") }

// LogFile is the path of a component's log (stdout and stderr).
func (l *Lab) LogFile(name string) string { return l.p("logs/" + name + ".log") }

// running returns the pid of the component when its pid file names a live
// process running the component's binary.
func (l *Lab) running(name, bin string) (int, bool) {
	data, err := os.ReadFile(l.pidFile(name))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, pidRuns(pid, bin)
}

// pidAlive reports whether pid exists and is not a zombie.
func pidAlive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return !(i > 0 && i+2 < len(stat) && stat[i+2] == 'Z')
}

// pidRuns reports whether pid is alive (not a zombie) and its argv[0] is
// bin. Right after exec the command line may not be set yet; start's
// callers check pidAlive on the pid start returned instead.
func pidRuns(pid int, bin string) bool {
	if !pidAlive(pid) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	arg0, _, _ := bytes.Cut(cmdline, []byte{0})
	return string(arg0) == bin
}

// start starts the component unless it already runs, detached in a
// session of its own so that it outlives the k8slab process, with its
// output appended to its log file. It returns the component's pid.
func (l *Lab) start(p proc) (pid int, err error) {
	if pid, ok := l.running(p.name, p.bin); ok {
		return pid, nil
	}
	logf, err := os.OpenFile(l.LogFile(p.name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("k8slab: start %s: %w", p.name, err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "\n==== k8slab: %s %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(append([]string{p.bin}, p.args...), " "))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Dir = l.p("")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("k8slab: start %s: %w", p.name, err)
	}
	pid = cmd.Process.Pid
	if err := os.WriteFile(l.pidFile(p.name), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return 0, fmt.Errorf("k8slab: start %s: %w", p.name, err)
	}
	// Reap it if it dies while this process lives (so running sees it
	// gone instead of a zombie); after this process exits, init reaps it.
	go func() { _ = cmd.Wait() }()
	return pid, nil
}

// stop sends SIGTERM to the component, then SIGKILL after grace, and
// removes its pid file.
func (l *Lab) stop(name, bin string, grace time.Duration) error {
	pid, ok := l.running(name, bin)
	if ok {
		if err := killWait(pid, bin, grace); err != nil {
			return fmt.Errorf("k8slab: stop %s: %w", name, err)
		}
	}
	if err := os.Remove(l.pidFile(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("k8slab: stop %s: %w", name, err)
	}
	return nil
}

func killWait(pid int, bin string, grace time.Duration) error {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for pidRuns(pid, bin) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if !waitGone(pid, bin, 5*time.Second) {
				return fmt.Errorf("pid %d survives SIGKILL", pid)
			}
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func waitGone(pid int, bin string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for pidRuns(pid, bin) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// tail returns the last n lines of a component's log, for error messages.
func (l *Lab) tail(name string, n int) string {
	data, err := os.ReadFile(l.LogFile(name))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// run runs a short command and returns its combined output in the error.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
