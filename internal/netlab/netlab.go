package netlab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrUnsupported: this machine does not let the Lab create namespaces (not
// root, EPERM, or ip/tc missing). Match with errors.Is.
var ErrUnsupported = errors.New("netlab: network namespaces not available")

// ErrNoNetem: the kernel has no netem qdisc, so a shape with delay or
// loss cannot be applied (rate alone can: tbf). Match with errors.Is.
var ErrNoNetem = errors.New("netlab: kernel lacks the netem qdisc (sch_netem): no delay or loss shaping")

// ErrClosed: the Lab was closed.
var ErrClosed = errors.New("netlab: lab closed")

// prefix starts the name of every namespace a Lab creates.
const prefix = "pdl-"

// Lab is one run's set of namespaces, links and processes. Safe for
// concurrent use.
type Lab struct {
	run string // unique per run: pid and random hex

	mu       sync.Mutex
	closed   bool
	ns       []*Namespace
	links    []*Link
	switches int
	procs    []*exec.Cmd
}

// Namespace is a network namespace of a Lab.
type Namespace struct {
	lab  *Lab
	Name string // short name given to AddNamespace
	// NetNS is the namespace's name for ip netns.
	NetNS string
}

// Link is a veth pair between two namespaces, with an address at each
// end, shaped in both directions.
type Link struct {
	lab        *Lab
	A, B       *Namespace
	DevA, DevB string     // interface names inside A and B
	AddrA      netip.Addr // A's address, in 198.18.0.0/15
	AddrB      netip.Addr // B's address

	mu    sync.Mutex
	shape Shape
}

// Shape is what a link does to packets, the same in both directions.
type Shape struct {
	// RateBitsPerSec caps the link (tbf); 0 leaves it unshaped.
	RateBitsPerSec float64
	// Delay is the one-way delay added (netem); 0 adds none.
	Delay time.Duration
	// LossPercent drops that share of packets (netem), in [0, 100].
	// Link.SetUp(false) partitions without netem.
	LossPercent float64
}

// String writes s in tc's terms.
func (s Shape) String() string {
	return fmt.Sprintf("rate %s delay %s loss %g%%", rateArg(s.RateBitsPerSec), s.Delay, s.LossPercent)
}

// LabNet is the block every address comes from: 198.18.0.0/15 (a
// coordinator in the lab is given it as --worker-networks).
var LabNet = netip.MustParsePrefix("198.18.0.0/15")

// New returns an empty Lab after deleting the namespaces of Labs whose
// process is gone (Sweep). Errors: ErrUnsupported, wrapped with why.
func New(ctx context.Context) (*Lab, error) {
	if err := Supported(ctx); err != nil {
		return nil, err
	}
	_ = Sweep(ctx)
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("netlab: run id: %w", err)
	}
	return &Lab{run: fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b[:]))}, nil
}

// Supported reports nil when this process can create namespaces, or an
// error wrapping ErrUnsupported that says why not. It creates and deletes
// one probe namespace.
func Supported(ctx context.Context) error {
	for _, bin := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%w: %s not found: %v", ErrUnsupported, bin, err)
		}
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not root (euid %d); network namespaces need CAP_SYS_ADMIN", ErrUnsupported, os.Geteuid())
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	probe := fmt.Sprintf("%s%d-%s-probe", prefix, os.Getpid(), hex.EncodeToString(b[:]))
	if out, err := runIP(ctx, "netns", "add", probe); err != nil {
		return fmt.Errorf("%w: ip netns add: %v: %s", ErrUnsupported, err, out)
	}
	if out, err := runIP(ctx, "netns", "del", probe); err != nil {
		return fmt.Errorf("netlab: delete probe namespace %s: %v: %s", probe, err, out)
	}
	return nil
}

// AddNamespace creates a namespace with loopback up. name is short
// (letters, digits, '-', at most 16 bytes) and unique in the Lab.
func (l *Lab) AddNamespace(ctx context.Context, name string) (*Namespace, error) {
	if !validName.MatchString(name) {
		return nil, fmt.Errorf("netlab: namespace name %q: want 1 to 16 letters, digits or '-'", name)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	for _, n := range l.ns {
		if n.Name == name {
			l.mu.Unlock()
			return nil, fmt.Errorf("netlab: namespace %q exists", name)
		}
	}
	n := &Namespace{lab: l, Name: name, NetNS: prefix + l.run + "-" + name}
	l.ns = append(l.ns, n) // before it exists, so that Close deletes it whatever happens
	l.mu.Unlock()
	if out, err := runIP(ctx, "netns", "add", n.NetNS); err != nil {
		return nil, fmt.Errorf("netlab: create namespace %s: %v: %s", n.NetNS, err, out)
	}
	if out, err := runIP(ctx, "-n", n.NetNS, "link", "set", "lo", "up"); err != nil {
		return nil, fmt.Errorf("netlab: loopback up in %s: %v: %s", n.NetNS, err, out)
	}
	return n, nil
}

var validName = regexp.MustCompile(`^[A-Za-z0-9-]{1,16}$`)

// Connect joins a and b with a veth pair created inside them, gives each
// end an address of a /30 from 198.18.0.0/15 and applies s to both
// directions.
func (l *Lab) Connect(ctx context.Context, a, b *Namespace, s Shape) (*Link, error) {
	if a.lab != l || b.lab != l || a == b {
		return nil, errors.New("netlab: connect: namespaces must be two different ones of this lab")
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	i := len(l.links)
	if (i+1)*4 > 1<<(32-LabNet.Bits()) {
		l.mu.Unlock()
		return nil, errors.New("netlab: connect: out of addresses")
	}
	base := LabNet.Addr().As4()
	off := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	off += uint32(i) * 4
	addr := func(k uint32) netip.Addr {
		v := off + k
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	// Interface names: at most 15 bytes, unique inside each namespace.
	k := &Link{lab: l, A: a, B: b, DevA: fmt.Sprintf("v%da", i), DevB: fmt.Sprintf("v%db", i), AddrA: addr(1), AddrB: addr(2)}
	l.links = append(l.links, k)
	l.mu.Unlock()

	steps := [][]string{
		{"link", "add", k.DevA, "netns", a.NetNS, "type", "veth", "peer", "name", k.DevB, "netns", b.NetNS},
		{"-n", a.NetNS, "addr", "add", k.AddrA.String() + "/30", "dev", k.DevA},
		{"-n", b.NetNS, "addr", "add", k.AddrB.String() + "/30", "dev", k.DevB},
		{"-n", a.NetNS, "link", "set", k.DevA, "up"},
		{"-n", b.NetNS, "link", "set", k.DevB, "up"},
	}
	for _, st := range steps {
		if out, err := runIP(ctx, st...); err != nil {
			return nil, fmt.Errorf("netlab: connect %s-%s: ip %s: %v: %s", a.Name, b.Name, strings.Join(st, " "), err, out)
		}
	}
	if err := k.apply(ctx, s, "add"); err != nil {
		return nil, err
	}
	return k, nil
}

// Shape returns the shape last applied.
func (k *Link) Shape() Shape {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.shape
}

// SetShape replaces the link's shape in both directions, live (TCP
// connections across it survive). Errors: ErrNoNetem (wrapped) for delay
// or loss on a kernel without netem.
func (k *Link) SetShape(ctx context.Context, s Shape) error { return k.apply(ctx, s, "replace") }

// apply installs s on both ends. Without delay or loss: tbf (rate) at the
// root. With them: netem (delay, loss, and a queue long enough for the
// bandwidth-delay product) at the root and tbf below it. Kernels without
// sch_netem get ErrNoNetem for a shape with delay or loss.
func (k *Link) apply(ctx context.Context, s Shape, verb string) error {
	if s.RateBitsPerSec < 0 || s.Delay < 0 || s.LossPercent < 0 || s.LossPercent > 100 {
		return fmt.Errorf("netlab: shape %v: negative rate or delay, or loss outside [0, 100]", s)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	useNetem := s.Delay > 0 || s.LossPercent > 0
	for _, end := range []struct{ ns, dev string }{{k.A.NetNS, k.DevA}, {k.B.NetNS, k.DevB}} {
		// Start from the device's default qdisc: the kind at the root
		// may change (tbf ↔ netem).
		_, _ = runTC(ctx, "-n", end.ns, "qdisc", "del", "dev", end.dev, "root")
		parent := []string{"root", "handle", "1:"}
		if useNetem {
			netem := []string{"-n", end.ns, "qdisc", "add", "dev", end.dev, "root", "handle", "1:", "netem",
				"limit", "100000", "delay", usec(s.Delay)}
			if s.LossPercent > 0 {
				netem = append(netem, "loss", strconv.FormatFloat(s.LossPercent, 'f', -1, 64)+"%")
			}
			if out, err := runTC(ctx, netem...); err != nil {
				if bytes.Contains(out, []byte("qdisc kind is unknown")) {
					return fmt.Errorf("netlab: shape %s in %s: %w", end.dev, end.ns, ErrNoNetem)
				}
				return fmt.Errorf("netlab: shape %s in %s: tc %s: %v: %s", end.dev, end.ns, strings.Join(netem, " "), err, out)
			}
			parent = []string{"parent", "1:1", "handle", "10:"}
		}
		if s.RateBitsPerSec > 0 {
			// burst: at least a GSO super-packet (64 KiB) and 1 ms of
			// the rate, so the token bucket keeps up with the kernel's
			// timer granularity; queue: 50 ms of the rate.
			burst := max(256<<10, int(s.RateBitsPerSec/8/1000))
			tbf := append([]string{"-n", end.ns, "qdisc", "add", "dev", end.dev}, parent...)
			tbf = append(tbf, "tbf", "rate", rateArg(s.RateBitsPerSec), "burst", strconv.Itoa(burst), "latency", "50ms")
			if out, err := runTC(ctx, tbf...); err != nil {
				return fmt.Errorf("netlab: rate %s in %s: tc %s: %v: %s", end.dev, end.ns, strings.Join(tbf, " "), err, out)
			}
		}
	}
	k.shape = s
	return nil
}

// SetUp brings both ends of the link up or down. Down partitions the
// namespaces: packets are dropped, and TCP connections across it live on
// (retransmitting) until it is up again or they time out. Up restores the
// addresses' routes.
func (k *Link) SetUp(ctx context.Context, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	for _, end := range []struct{ ns, dev string }{{k.A.NetNS, k.DevA}, {k.B.NetNS, k.DevB}} {
		if out, err := runIP(ctx, "-n", end.ns, "link", "set", end.dev, state); err != nil {
			return fmt.Errorf("netlab: link %s %s in %s: %v: %s", end.dev, state, end.ns, err, out)
		}
	}
	return nil
}

func usec(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) + "us" }

func rateArg(bps float64) string {
	if bps <= 0 {
		return "unlimited"
	}
	return strconv.FormatFloat(bps, 'f', 0, 64) + "bit"
}

// Command returns a command that runs name with args inside n (through
// ip netns exec, which execs it: the process's pid is the program's). It
// runs in its own process group. Start it with Lab.Start so that Close
// kills it.
func (n *Namespace) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.NetNS, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Start starts cmd (from Namespace.Command) and remembers it, so that
// Close kills it if it is still running. The caller still Waits for it.
func (l *Lab) Start(cmd *exec.Cmd) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("netlab: start %s: %w", strings.Join(cmd.Args, " "), err)
	}
	l.procs = append(l.procs, cmd)
	return nil
}

// Close kills the processes the Lab started and still running (their
// process groups), then deletes its namespaces (and with them the
// veths). It is idempotent; it returns the first failure to delete a
// namespace.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	procs, ns := l.procs, l.ns
	l.mu.Unlock()
	for _, c := range procs {
		// The group may be gone already (ESRCH); what still runs in a
		// namespace is killed by deleteNS too.
		if c.Process != nil {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = syscall.Kill(c.Process.Pid, syscall.SIGCONT) // a stopped one too
		}
	}
	var first error
	for i := len(ns) - 1; i >= 0; i-- {
		if err := deleteNS(ns[i].NetNS); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// deleteNS deletes a namespace, killing what still runs in it first (a
// namespace whose processes live on would keep its veths).
func deleteNS(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := runIP(ctx, "netns", "pids", name); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		}
	}
	out, err := runIP(ctx, "netns", "del", name)
	if err != nil && !bytes.Contains(out, []byte("No such file")) {
		return fmt.Errorf("netlab: delete namespace %s: %v: %s", name, err, out)
	}
	return nil
}

// Sweep deletes the namespaces of Labs whose process no longer runs
// (left by a run killed with SIGKILL). It touches only names this package
// makes: "pdl-<pid>-...".
func Sweep(ctx context.Context) error {
	names, err := List(ctx)
	if err != nil {
		return err
	}
	var first error
	for _, n := range names {
		rest := strings.TrimPrefix(n, prefix)
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 {
			continue
		}
		if syscall.Kill(pid, 0) == nil || pid == os.Getpid() {
			continue // alive: another run's (or ours)
		}
		if err := deleteNS(n); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// List returns the names of every namespace this package made (of any
// run) that still exists.
func List(ctx context.Context) ([]string, error) {
	out, err := runIP(ctx, "netns", "list")
	if err != nil {
		return nil, fmt.Errorf("netlab: ip netns list: %v: %s", err, out)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// Namespaces returns the namespace names of this Lab (for checks).
func (l *Lab) Namespaces() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(l.ns))
	for i, n := range l.ns {
		out[i] = n.NetNS
	}
	return out
}

func runIP(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "ip", args...).CombinedOutput()
}

func runTC(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "tc", args...).CombinedOutput()
}
