package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/internal/netlab"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/region"
)

// The regions command measures a federation of three regions on real
// links: each region a network namespace with its own standalone
// coordinator process (sim workers), the regions joined by veth links
// whose round trips delay proxies make, and each region's load sent from
// its own namespace to its own coordinator with a TTFT budget. In the
// kill-pool phase the victim region's pool is two worker processes of
// their own beside a coordinator that is not standalone, so that the
// pool dies and the coordinator lives. Every phase runs twice on fresh
// processes: federated (--region flags, gateways and forwarding over
// mutual TLS) and not (the same coordinators without them).

// regionNames are the regions, in the order of --rates and of the link
// pairs of --rtts: a-b, a-c, b-c.
var regionNames = []string{"a", "b", "c"}

// regionIP is region i's own address (on its loopback), the one its
// certificate names and its peers reach through the link between them.
func regionIP(i int) string { return fmt.Sprintf("198.19.255.%d", i+1) }

const (
	regionHTTPPort    = "8080"
	regionGatewayPort = "7222"
	regionPeerPort    = "8443"
	// regionNATSPort is the embedded NATS server's port of a coordinator
	// whose workers are processes of their own (on its loopback).
	regionNATSPort = "4222"
	// regionsChildEnv, when set, makes this binary a load client: the
	// value is its JSON clientConfig.
	regionsChildEnv = "PDSERVE_REGIONS_CLIENT"
	// regionsProxyEnv, when set, makes this binary a delay proxy: the
	// value is its JSON proxyConfig.
	regionsProxyEnv = "PDSERVE_REGIONS_PROXY"
)

type regionsOpts struct {
	bin         string          // holds coordinator, prefill-worker and decode-worker
	rtts        []time.Duration // a-b, a-c, b-c
	rates       []float64       // per region
	budgetMs    float64
	phaseDur    time.Duration
	promptWords int
	maxTokens   int
	engineFlags []string
	phases      []string
	modes       []string
	victim      int // region killed, or cut off from a, in the fault phases
	timeout     time.Duration
	seed        uint64
	tmp         string
	self        string
	stderr      io.Writer
}

// regionsPhases are the phases: the fault each injects a third into the
// load (restore-link: and undoes two thirds into it).
var regionsPhases = []string{"steady", "kill-coordinator", "kill-pool", "cut-link", "restore-link"}

// regionsWorkers are the binaries of the victim's pool in the kill-pool
// phase, by worker id.
var regionsWorkers = [][2]string{{"prefill-0", "prefill-worker"}, {"decode-0", "decode-worker"}}

func cmdRegions(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("regions", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o regionsOpts
	fs.StringVar(&o.bin, "bin", "", "directory of the coordinator, prefill-worker and decode-worker binaries (empty: built from ./cmd into a temporary directory)")
	rtts := fs.String("rtts", "20ms,90ms,180ms", "round trips of the links a-b, a-c and b-c (netem delay of half each way)")
	rates := fs.String("rates", "12,2,2", "requests per second sent from regions a, b and c to their own coordinator (Poisson)")
	fs.Float64Var(&o.budgetMs, "ttft-budget-ms", 600, "TTFT budget of every request (header "+frontend.HeaderTTFTBudget+")")
	fs.DurationVar(&o.phaseDur, "duration", 20*time.Second, "load of each phase")
	fs.IntVar(&o.promptWords, "prompt-words", 300, "random words of each prompt, about 7 tokens each (so that no prefix is cached)")
	fs.IntVar(&o.maxTokens, "max-tokens", 16, "output tokens of each request")
	eflags := fs.String("engine-flags", "--engine sim --profile h100/llama-3-8b/tp1", "engine flags of every region's one prefill and one decode worker (standalone in its coordinator, or in kill-pool the victim's worker processes)")
	phases := fs.String("phases", strings.Join(regionsPhases, ","), "phases, comma separated: "+strings.Join(regionsPhases, ", "))
	modes := fs.String("modes", "federated,alone", "runs of each phase: federated (--region flags), alone (none)")
	victim := fs.String("victim", "b", "kill-coordinator, kill-pool: the region whose coordinator or pool (both its workers) is killed; cut-link, restore-link: the region whose link to a is cut (and restored)")
	fs.DurationVar(&o.timeout, "request-timeout", 30*time.Second, "a request without an answer by then is lost")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of arrivals and prompts")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: regions: unexpected arguments %q", errUsage, fs.Args())
	}
	var err error
	if o.rtts, err = parseList(*rtts, 3, time.ParseDuration); err != nil {
		return fmt.Errorf("%w: --rtts: %v", errUsage, err)
	}
	if o.rates, err = parseList(*rates, 3, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) }); err != nil {
		return fmt.Errorf("%w: --rates: %v", errUsage, err)
	}
	for _, r := range o.rates {
		if r <= 0 || math.IsInf(r, 0) || math.IsNaN(r) {
			return fmt.Errorf("%w: --rates: each must be positive, got %v", errUsage, o.rates)
		}
	}
	for _, d := range o.rtts {
		if d < 0 {
			return fmt.Errorf("%w: --rtts: negative round trip %v", errUsage, d)
		}
	}
	if o.budgetMs <= 0 || o.phaseDur <= 0 || o.promptWords <= 0 || o.maxTokens <= 0 || o.timeout <= 0 {
		return fmt.Errorf("%w: --ttft-budget-ms, --duration, --prompt-words, --max-tokens and --request-timeout must be positive", errUsage)
	}
	o.engineFlags = strings.Fields(*eflags)
	o.phases = strings.FieldsFunc(*phases, func(r rune) bool { return r == ',' })
	for _, p := range o.phases {
		if !slices.Contains(regionsPhases, p) {
			return fmt.Errorf("%w: --phases: unknown phase %q", errUsage, p)
		}
	}
	o.modes = strings.FieldsFunc(*modes, func(r rune) bool { return r == ',' })
	for _, m := range o.modes {
		if m != "federated" && m != "alone" {
			return fmt.Errorf("%w: --modes: unknown mode %q (federated, alone)", errUsage, m)
		}
	}
	if o.victim = slices.Index(regionNames, *victim); o.victim <= 0 {
		return fmt.Errorf("%w: --victim: b or c (a is the loaded region), got %q", errUsage, *victim)
	}
	if err := netlab.Supported(ctx); err != nil {
		return fmt.Errorf("regions: %w", err)
	}
	// The region addresses are DNAT rules in each namespace (route).
	if _, err := exec.LookPath("iptables"); err != nil {
		return fmt.Errorf("regions: iptables not found (Debian: apt-get install iptables): %v", err)
	}
	if o.self, err = os.Executable(); err != nil {
		return err
	}
	o.stderr = stderr
	if o.tmp, err = os.MkdirTemp("", "pdserve-regions-"); err != nil {
		return err
	}
	defer os.RemoveAll(o.tmp)
	if o.bin == "" {
		o.bin = o.tmp
		b := exec.CommandContext(ctx, "go", "build", "-o", o.bin+string(filepath.Separator), "./cmd/coordinator", "./cmd/prefill-worker", "./cmd/decode-worker")
		if out, err := b.CombinedOutput(); err != nil {
			return fmt.Errorf("regions: build the binaries (run from the repository root, or give --bin): %v: %s", err, out)
		}
	}
	for _, b := range []string{"coordinator", "prefill-worker", "decode-worker"} {
		if _, err := os.Stat(filepath.Join(o.bin, b)); err != nil {
			return fmt.Errorf("%w: --bin: %v", errUsage, err)
		}
	}
	if err := writeRegionCerts(o.tmp); err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	for _, p := range o.phases {
		for _, m := range o.modes {
			lines, err := o.runPhase(ctx, p, m == "federated")
			if err != nil {
				return fmt.Errorf("regions: phase %s, %s: %w", p, m, err)
			}
			for _, l := range lines {
				if err := enc.Encode(l); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func parseList[T any](s string, n int, parse func(string) (T, error)) ([]T, error) {
	f := strings.Split(s, ",")
	if len(f) != n {
		return nil, fmt.Errorf("want %d comma-separated values, got %q", n, s)
	}
	out := make([]T, n)
	for i, v := range f {
		x, err := parse(strings.TrimSpace(v))
		if err != nil {
			return nil, err
		}
		out[i] = x
	}
	return out, nil
}

// regionLine is one region of origin's figures in one phase and mode.
type regionLine struct {
	Phase     string  `json:"phase"`
	Mode      string  `json:"mode"`
	Origin    string  `json:"origin"`
	Sent      int     `json:"sent"`
	OK        int     `json:"ok"`
	P50TTFTMs float64 `json:"p50_ttft_ms"`
	P95TTFTMs float64 `json:"p95_ttft_ms"`
	// WithinBudget is the share of the requests sent that completed with
	// a TTFT within the budget.
	WithinBudget float64 `json:"within_budget"`
	// ServedBy counts the completed requests by the region that served
	// them (the X-PDServe-Region header; the origin when absent).
	ServedBy map[string]int `json:"served_by"`
	// Rejected: an HTTP error status (by status). Cut: the stream had
	// started and ended with an error or without [DONE] (failed
	// clearly). ConnErr: no HTTP answer (connection refused or reset).
	// Lost: no answer and no error within --request-timeout.
	Rejected map[string]int `json:"rejected"`
	Cut      int            `json:"cut"`
	ConnErr  int            `json:"conn_err"`
	Lost     int            `json:"lost"`
	// FirstError is the first failed request's error, as its client saw it.
	FirstError string `json:"first_error,omitempty"`
	// ServedAfterFault counts the completed requests sent after the
	// phase's fault by the region that served them (as ServedBy), and
	// FailedAfterFault those sent after it that did not complete; both
	// absent in a phase without a fault.
	ServedAfterFault map[string]int `json:"served_after_fault,omitempty"`
	FailedAfterFault int            `json:"failed_after_fault,omitempty"`
}

// phaseLine is the phase's count of completions at the servers against
// answers at the clients.
type phaseLine struct {
	Phase string `json:"phase"`
	Mode  string `json:"mode"`
	// ClientOK is the complete answers at every client; ServerOK the sum
	// over coordinators of pdserve_requests_total{status="ok"} (a killed
	// coordinator's read just before the kill).
	ClientOK int `json:"client_ok"`
	ServerOK int `json:"server_ok"`
	// Unanswered is ServerOK − ClientOK when positive: completions no
	// client received as its answer. MayHaveRun is the clients' clear
	// failures of requests that may have run (cut streams, 502s: a
	// forward whose answer a link lost), and Duplicated what Unanswered
	// exceeds them by: completions beyond every answer and every such
	// failure, requests served twice. Unmatched is ClientOK − ServerOK
	// when positive (a killed coordinator completing after its read).
	Unanswered int    `json:"unanswered"`
	MayHaveRun int    `json:"may_have_run"`
	Duplicated int    `json:"duplicated"`
	Unmatched  int    `json:"unmatched"`
	Lost       int    `json:"lost"`
	FaultAtMs  int    `json:"fault_at_ms,omitempty"`
	Fault      string `json:"fault,omitempty"`
	// RestoredAtMs (restore-link) is when the link came back up, from
	// the load's start. RecoveryMs (federated) is how long after that
	// none was); PeersAtRestore is a's count of peers then
	// (pdserve_region_peers) and, when it was under 2, PeerBackMs how
	// long after the restore a counted both again (read every 100 ms;
	// null: not before the load ended).
	RestoredAtMs   int      `json:"restored_at_ms,omitempty"`
	RecoveryMs     *int     `json:"recovery_ms,omitempty"`
	PeerBackMs     *int     `json:"peer_back_ms,omitempty"`
	PeersAtRestore *float64 `json:"peers_at_restore,omitempty"`
}

// regionLab is the three regions' namespaces and links.
type regionLab struct {
	lab   *netlab.Lab
	ns    []*netlab.Namespace
	links map[[2]int]*netlab.Link
	procs []*exec.Cmd
	exits []chan struct{}
}

// peerVia returns the link between i and j.
func (r *regionLab) link(i, j int) *netlab.Link {
	if i > j {
		i, j = j, i
	}
	return r.links[[2]int{i, j}]
}

// peerAddr returns i's address on its link to j.
func (r *regionLab) peerAddr(i, j int) string {
	k := r.link(i, j)
	if k.A == r.ns[i] {
		return k.AddrA.String()
	}
	return k.AddrB.String()
}

// route makes j's connections to i's region address go to i's end of
// their link (DNAT in j), where i's delay proxy listens. Without dnat it
// only puts the route back (a link set down loses the routes through it;
// the DNAT rule stays).
func (r *regionLab) route(ctx context.Context, i, j int, dnat bool) error {
	// The route first: a local packet needs one before OUTPUT's DNAT.
	cmds := [][]string{{"ip", "route", "replace", regionIP(i) + "/32", "via", r.peerAddr(i, j)}}
	if dnat {
		cmds = append(cmds, []string{"iptables", "-t", "nat", "-A", "OUTPUT", "-d", regionIP(i) + "/32", "-j", "DNAT", "--to-destination", r.peerAddr(i, j)})
	}
	for _, c := range cmds {
		if out, err := r.ns[j].Command(ctx, c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("route %s→%s: %s: %v: %s", regionNames[j], regionNames[i], strings.Join(c, " "), err, out)
		}
	}
	return nil
}

func (o *regionsOpts) newLab(ctx context.Context, logf *os.File) (*regionLab, error) {
	lab, err := netlab.New(ctx)
	if err != nil {
		return nil, err
	}
	r := &regionLab{lab: lab, links: map[[2]int]*netlab.Link{}}
	for i, n := range regionNames {
		ns, err := lab.AddNamespace(ctx, "region-"+n)
		if err != nil {
			return r, err
		}
		if out, err := ns.Command(ctx, "ip", "addr", "add", regionIP(i)+"/32", "dev", "lo").CombinedOutput(); err != nil {
			return r, fmt.Errorf("region address: %v: %s", err, out)
		}
		r.ns = append(r.ns, ns)
	}
	for _, p := range [][2]int{{0, 1}, {0, 2}, {1, 2}} {
		l, err := lab.Connect(ctx, r.ns[p[0]], r.ns[p[1]], netlab.Shape{})
		if err != nil {
			return r, err
		}
		r.links[p] = l
	}
	for k, p := range [][2]int{{0, 1}, {0, 2}, {1, 2}} {
		for _, e := range [][2]int{p, {p[1], p[0]}} {
			i, j := e[0], e[1]
			if err := r.route(ctx, i, j, true); err != nil {
				return r, err
			}
			// i's delay proxy for j: j's connections to i's gateway and
			// peer listener, delayed by half the round trip each way.
			var pc proxyConfig
			for _, port := range []string{regionGatewayPort, regionPeerPort} {
				pc.Pairs = append(pc.Pairs, [2]string{net.JoinHostPort(r.peerAddr(i, j), port), net.JoinHostPort(regionIP(i), port)})
			}
			pc.DelayUs = (o.rtts[k] / 2).Microseconds()
			b, _ := json.Marshal(pc)
			cmd := r.ns[i].Command(ctx, o.self)
			cmd.Env = append(os.Environ(), regionsProxyEnv+"="+string(b))
			cmd.Stderr = logf
			if err := lab.Start(cmd); err != nil {
				return r, err
			}
			go func() { _ = cmd.Wait() }()
		}
	}
	return r, nil
}

// coordArgs are region i's coordinator's flags: standalone with one
// prefill and one decode worker, or (split) serving the workers started
// apart, through its embedded NATS server on the region's loopback.
func (o *regionsOpts) coordArgs(i int, federated, split bool) []string {
	args := []string{"--http-addr", "127.0.0.1:" + regionHTTPPort, "--log-level", "warn"}
	if split {
		args = append(args, "--nats-listen", "127.0.0.1:"+regionNATSPort, "--nats-auth-file", filepath.Join(o.tmp, "users.yaml"),
			"--worker-networks", "127.0.0.0/8")
		args = append(args, cliflags.Without(o.engineFlags, coordinator.WorkerOnlyFlags)...)
	} else {
		args = append(args, "--standalone", "--prefill-workers", "1", "--decode-workers", "1")
		args = append(args, o.engineFlags...)
	}
	if !federated {
		return args
	}
	n := regionNames[i]
	args = append(args, "--region", n,
		"--region-gateway-listen", net.JoinHostPort(regionIP(i), regionGatewayPort),
		"--region-advertise-url", "https://"+net.JoinHostPort(regionIP(i), regionPeerPort),
		"--region-tls-cert", filepath.Join(o.tmp, n+".crt"), "--region-tls-key", filepath.Join(o.tmp, n+".key"),
		"--region-tls-ca", filepath.Join(o.tmp, "ca.crt"))
	for j, m := range regionNames {
		if j != i {
			args = append(args, "--region-gateway", m+"=nats://"+net.JoinHostPort(regionIP(j), regionGatewayPort))
		}
	}
	return args
}

// curl fetches url from inside region i's namespace.
func (r *regionLab) curl(ctx context.Context, i int, url string) (string, error) {
	out, err := r.ns[i].Command(ctx, "curl", "-sf", "--max-time", "2", url).Output()
	return string(out), err
}

// startPool writes the NATS users of region i's workers and starts them
// (regionsWorkers) in its namespace, once its coordinator's embedded NATS
// server listens; it returns their commands and exit channels.
func (o *regionsOpts) startPool(ctx context.Context, r *regionLab, i int, logf *os.File) ([]*exec.Cmd, []chan struct{}, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := r.curl(ctx, i, "http://127.0.0.1:"+regionHTTPPort+"/healthz"); err == nil {
			break
		}
		select {
		case <-r.exits[i]:
			return nil, nil, fmt.Errorf("coordinator %s exited at start (log: %s)", regionNames[i], tail(logf.Name()))
		default:
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("coordinator %s not healthy within 60 s (log: %s)", regionNames[i], tail(logf.Name()))
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return nil, nil, err
		}
	}
	var cmds []*exec.Cmd
	var exits []chan struct{}
	for k, w := range regionsWorkers {
		id, bin := w[0], w[1]
		user := strings.TrimSuffix(bin, "-worker")
		args := []string{"--id", id, "--nats-url", "nats://127.0.0.1:" + regionNATSPort, "--nats-user", user,
			"--nats-password-file", filepath.Join(o.tmp, user+".pw"), "--nats-reconnect-wait", "250ms",
			"--grpc-addr", "127.0.0.1:" + strconv.Itoa(9100+k), "--metrics-addr=", "--log-level", "warn"}
		cmd := r.ns[i].Command(ctx, filepath.Join(o.bin, bin), append(args, o.engineFlags...)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := r.lab.Start(cmd); err != nil {
			return nil, nil, err
		}
		ch := make(chan struct{})
		go func() { _ = cmd.Wait(); close(ch) }()
		cmds, exits = append(cmds, cmd), append(exits, ch)
	}
	return cmds, exits, nil
}

// writeRegionUsers writes the NATS users of a split region's workers
// (users.yaml, the coordinator's --nats-auth-file) and their passwords
// (ROLE.pw) into dir.
func writeRegionUsers(dir string) error {
	var users strings.Builder
	users.WriteString("users:\n")
	for _, w := range regionsWorkers {
		role := strings.TrimSuffix(w[1], "-worker")
		var b [16]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		pw := fmt.Sprintf("%x", b)
		if err := os.WriteFile(filepath.Join(dir, role+".pw"), []byte(pw), 0o600); err != nil {
			return err
		}
		fmt.Fprintf(&users, "  - {user: %s, password: %s, role: %s}\n", role, pw, role)
	}
	return os.WriteFile(filepath.Join(dir, "users.yaml"), []byte(users.String()), 0o600)
}

// metric sums the samples of name whose line contains every label of want.
func metric(text, name string, want ...string) (float64, bool) {
	sum, found := 0.0, false
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != '{' && l[len(name)] != ' ') {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(l, w)
		}
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); ok && err == nil {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

func (o *regionsOpts) runPhase(ctx context.Context, phase string, federated bool) ([]any, error) {
	mode := "alone"
	if federated {
		mode = "federated"
	}
	// The processes' log: a file, which every process writes to directly
	// (a shared io.Writer would be written by their copying goroutines
	// at once).
	logf, err := os.Create(filepath.Join(o.tmp, phase+"-"+mode+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	r, err := o.newLab(ctx, logf)
	if r != nil {
		defer r.lab.Close()
	}
	if err != nil {
		return nil, err
	}
	split := phase == "kill-pool" // the victim's pool apart from its coordinator
	if split {
		if err := writeRegionUsers(o.tmp); err != nil {
			return nil, err
		}
	}
	for i := range regionNames {
		cmd := r.ns[i].Command(ctx, filepath.Join(o.bin, "coordinator"), o.coordArgs(i, federated, split && i == o.victim)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := r.lab.Start(cmd); err != nil {
			return nil, err
		}
		ch := make(chan struct{})
		go func() { _ = cmd.Wait(); close(ch) }()
		r.procs, r.exits = append(r.procs, cmd), append(r.exits, ch)
	}
	var pool []*exec.Cmd
	var poolExits []chan struct{}
	if split {
		if pool, poolExits, err = o.startPool(ctx, r, o.victim, logf); err != nil {
			return nil, err
		}
	}
	// Ready: every coordinator serves, and hears from both peers.
	deadline := time.Now().Add(60 * time.Second)
	for i := range regionNames {
		for {
			m, err := r.curl(ctx, i, "http://127.0.0.1:"+regionHTTPPort+"/metrics")
			_, rerr := r.curl(ctx, i, "http://127.0.0.1:"+regionHTTPPort+"/readyz")
			peers, _ := metric(m, "pdserve_region_peers")
			if err == nil && rerr == nil && (!federated || peers >= 2) {
				break
			}
			select {
			case <-r.exits[i]:
				return nil, fmt.Errorf("coordinator %s exited at start (log: %s)", regionNames[i], tail(logf.Name()))
			default:
			}
			for k, ch := range poolExits {
				select {
				case <-ch:
					return nil, fmt.Errorf("worker %s of %s exited at start (log: %s)", regionsWorkers[k][0], regionNames[i], tail(logf.Name()))
				default:
				}
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("coordinator %s not ready (peers %v) within 60 s (log: %s)", regionNames[i], peers, tail(logf.Name()))
			}
			if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
				return nil, err
			}
		}
	}
	// The model, asked here: a client started late (a loaded machine)
	// must not find its coordinator already killed.
	models, err := r.curl(ctx, 0, "http://127.0.0.1:"+regionHTTPPort+"/v1/models")
	if err != nil {
		return nil, fmt.Errorf("models of a: %w", err)
	}
	model, err := firstModel(models)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.stderr, "regions: %s, %s: ready, load for %v\n", phase, mode, o.phaseDur)
	start := time.Now().Add(time.Second)
	type result struct {
		recs []clientRecord
		err  error
	}
	results := make([]result, len(regionNames))
	var wg sync.WaitGroup
	for i := range regionNames {
		cfg := clientConfig{URL: "http://127.0.0.1:" + regionHTTPPort, Model: model, Rate: o.rates[i], StartUnixMs: start.UnixMilli(),
			DurationMs: o.phaseDur.Milliseconds(), BudgetMs: o.budgetMs, PromptWords: o.promptWords, MaxTokens: o.maxTokens,
			TimeoutMs: o.timeout.Milliseconds(), Seed: o.seed + uint64(i)}
		b, _ := json.Marshal(cfg)
		cmd := r.ns[i].Command(ctx, o.self)
		cmd.Env = append(os.Environ(), regionsChildEnv+"="+string(b))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, logf
		if err := r.lab.Start(cmd); err != nil {
			return nil, err
		}
		wg.Go(func() {
			err := cmd.Wait()
			recs, perr := parseRecords(&out)
			results[i] = result{recs, errors.Join(err, perr)}
		})
	}
	serverOK := make([]float64, len(regionNames))
	read := func(i int) {
		if m, err := r.curl(ctx, i, "http://127.0.0.1:"+regionHTTPPort+"/metrics"); err == nil {
			serverOK[i], _ = metric(m, "pdserve_requests_total", `status="ok"`)
		}
	}
	pl := phaseLine{Phase: phase, Mode: mode}
	faultErr := make(chan error, 1)
	go func() {
		if err := sleepCtx(ctx, time.Until(start.Add(o.phaseDur/3))); err != nil {
			faultErr <- err
			return
		}
		switch phase {
		case "kill-coordinator":
			read(o.victim)
			_ = r.procs[o.victim].Process.Signal(syscall.SIGKILL)
			<-r.exits[o.victim]
			pl.Fault = "killed coordinator " + regionNames[o.victim]
		case "kill-pool":
			for k, p := range pool {
				_ = p.Process.Signal(syscall.SIGKILL)
				<-poolExits[k]
			}
			pl.Fault = "killed pool " + regionNames[o.victim] + " (its prefill and decode worker processes)"
		case "cut-link", "restore-link":
			pl.Fault = "cut link a-" + regionNames[o.victim]
			if err := r.link(0, o.victim).SetUp(ctx, false); err != nil {
				faultErr <- err
				return
			}
		}
		if pl.Fault != "" {
			pl.FaultAtMs = int(time.Since(start).Milliseconds())
		}
		if phase == "restore-link" {
			faultErr <- o.restoreLink(ctx, r, start, &pl, federated)
			return
		}
		faultErr <- nil
	}()
	wg.Wait()
	if err := <-faultErr; err != nil {
		return nil, err
	}
	for i := range regionNames {
		if phase == "kill-coordinator" && i == o.victim {
			continue
		}
		read(i)
	}
	var lines []any
	for i, n := range regionNames {
		if results[i].err != nil {
			return nil, fmt.Errorf("client of %s: %w (log: %s)", n, results[i].err, tail(logf.Name()))
		}
		l := summarize(results[i].recs, o.budgetMs, pl.FaultAtMs)
		l.Phase, l.Mode, l.Origin = phase, mode, n
		if phase == "restore-link" && federated && i == 0 {
			pl.RecoveryMs = recovery(results[i].recs, regionNames[o.victim], pl.RestoredAtMs)
		}
		lines = append(lines, l)
		pl.add(l, int(serverOK[i]))
	}
	return append(lines, pl), nil
}

// add counts a region's line and its coordinator's completions
// (serverOK) into the phase's.
func (pl *phaseLine) add(l regionLine, serverOK int) {
	pl.ClientOK += l.OK
	pl.Lost += l.Lost
	pl.ServerOK += serverOK
	pl.MayHaveRun += l.Cut + l.Rejected[strconv.Itoa(http.StatusBadGateway)]
	pl.Unanswered, pl.Unmatched = max(0, pl.ServerOK-pl.ClientOK), max(0, pl.ClientOK-pl.ServerOK)
	pl.Duplicated = max(0, pl.Unanswered-pl.MayHaveRun)
}

// restoreLink brings the link a-victim back up two thirds into the load
// (pl.RestoredAtMs) and, federated, reads a's peers every 100 ms until
// it counts both again or the load ends (pl.PeersAtRestore, PeerBackMs).
func (o *regionsOpts) restoreLink(ctx context.Context, r *regionLab, start time.Time, pl *phaseLine, federated bool) error {
	if err := sleepCtx(ctx, time.Until(start.Add(2*o.phaseDur/3))); err != nil {
		return err
	}
	if err := r.link(0, o.victim).SetUp(ctx, true); err != nil {
		return err
	}
	for _, e := range [][2]int{{0, o.victim}, {o.victim, 0}} {
		if err := r.route(ctx, e[0], e[1], false); err != nil {
			return err
		}
	}
	at := time.Now()
	pl.RestoredAtMs = int(at.Sub(start).Milliseconds())
	pl.Fault += ", restored"
	if !federated {
		return nil
	}
	for first := true; time.Now().Before(start.Add(o.phaseDur)); first = false {
		m, err := r.curl(ctx, 0, "http://127.0.0.1:"+regionHTTPPort+"/metrics")
		peers, ok := metric(m, "pdserve_region_peers")
		if err == nil && ok {
			if first {
				pl.PeersAtRestore = &peers
			}
			if peers >= 2 && first {
				return nil // a never lost the victim
			}
			if peers >= 2 {
				ms := int(time.Since(at).Milliseconds())
				pl.PeerBackMs = &ms
				return nil
			}
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// recovery returns how long after restoredAtMs the first of recs that
// region served was sent, nil when none was.
func recovery(recs []clientRecord, region string, restoredAtMs int) *int {
	var out *int
	for _, c := range recs {
		if c.Outcome == "ok" && c.Served == region && c.SentMs >= int64(restoredAtMs) {
			if d := int(c.SentMs) - restoredAtMs; out == nil || d < *out {
				out = &d
			}
		}
	}
	return out
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// summarize computes a region's line from its client's records;
// faultAtMs is when the phase's fault struck from the load's start (0:
// none).
func summarize(recs []clientRecord, budgetMs float64, faultAtMs int) regionLine {
	l := regionLine{Sent: len(recs), ServedBy: map[string]int{}, Rejected: map[string]int{}}
	if faultAtMs > 0 {
		l.ServedAfterFault = map[string]int{}
	}
	var ttfts []float64
	within := 0
	for _, r := range recs {
		if r.Outcome != "ok" && l.FirstError == "" {
			l.FirstError = r.Err
		}
		after := faultAtMs > 0 && r.SentMs >= int64(faultAtMs)
		if after && r.Outcome != "ok" {
			l.FailedAfterFault++
		}
		switch r.Outcome {
		case "ok":
			l.OK++
			ttfts = append(ttfts, r.TTFTMs)
			if r.TTFTMs <= budgetMs {
				within++
			}
			s := r.Served
			if s == "" {
				s = "origin"
			}
			l.ServedBy[s]++
			if after {
				l.ServedAfterFault[s]++
			}
		case "rejected":
			l.Rejected[strconv.Itoa(r.Status)]++
		case "cut":
			l.Cut++
		case "conn_err":
			l.ConnErr++
		default:
			l.Lost++
		}
	}
	slices.Sort(ttfts)
	l.P50TTFTMs, l.P95TTFTMs = quantile(ttfts, 0.5), quantile(ttfts, 0.95)
	if l.Sent > 0 {
		l.WithinBudget = float64(within) / float64(l.Sent)
	}
	return l
}

// quantile of sorted xs (nearest rank); 0 when empty.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	k := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(k, len(xs)-1))]
}

// clientConfig is a load client's task.
type clientConfig struct {
	URL         string  `json:"url"`
	Model       string  `json:"model"`
	Rate        float64 `json:"rate"`
	StartUnixMs int64   `json:"start_unix_ms"`
	DurationMs  int64   `json:"duration_ms"`
	BudgetMs    float64 `json:"budget_ms"`
	PromptWords int     `json:"prompt_words"`
	MaxTokens   int     `json:"max_tokens"`
	TimeoutMs   int64   `json:"timeout_ms"`
	Seed        uint64  `json:"seed"`
}

// clientRecord is one request as its client saw it.
type clientRecord struct {
	Outcome string  `json:"outcome"` // ok, rejected, cut, conn_err, lost
	SentMs  int64   `json:"sent_ms"` // when it was sent, from the load's start
	Status  int     `json:"status,omitempty"`
	TTFTMs  float64 `json:"ttft_ms,omitempty"`
	Served  string  `json:"served,omitempty"`
	Err     string  `json:"err,omitempty"`
}

func parseRecords(r io.Reader) ([]clientRecord, error) {
	var out []clientRecord
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var c clientRecord
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return nil, fmt.Errorf("client output %q: %w", sc.Text(), err)
		}
		out = append(out, c)
	}
	return out, sc.Err()
}

// regionsChild runs this process as a load client when regionsChildEnv
// is set (a child of the regions command, started inside a region's
// namespace) and exits; otherwise it returns.
func regionsChild() {
	if v := os.Getenv(regionsProxyEnv); v != "" {
		var c proxyConfig
		err := json.Unmarshal([]byte(v), &c)
		if err == nil {
			err = runProxy(c)
		}
		fmt.Fprintf(os.Stderr, "regions proxy: %v\n", err)
		os.Exit(1)
	}
	v := os.Getenv(regionsChildEnv)
	if v == "" {
		return
	}
	var c clientConfig
	if err := json.Unmarshal([]byte(v), &c); err != nil {
		fmt.Fprintf(os.Stderr, "regions client: %v\n", err)
		os.Exit(1)
	}
	if err := runClient(context.Background(), c, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "regions client: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runClient sends Poisson arrivals at c.Rate for c.DurationMs from
// c.StartUnixMs (the same arrivals for the same seed, however late this
// process started), each a streamed completion, and writes one JSON
// record per request when all have ended.
func runClient(ctx context.Context, c clientConfig, w io.Writer) error {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	rng := mrand.New(mrand.NewPCG(c.Seed, 0x5eed))
	// The arrivals are times from the start, the same whenever this
	// process got to run: one started late sends the ones past at once.
	next := time.UnixMilli(c.StartUnixMs)
	end := next.Add(time.Duration(c.DurationMs) * time.Millisecond)
	var mu sync.Mutex
	var recs []clientRecord
	var wg sync.WaitGroup
	for {
		next = next.Add(time.Duration(rng.ExpFloat64() / c.Rate * float64(time.Second)))
		if next.After(end) {
			break
		}
		if err := sleepCtx(ctx, time.Until(next)); err != nil {
			return err
		}
		var sb strings.Builder
		for range c.PromptWords {
			fmt.Fprintf(&sb, "w%d ", rng.IntN(100000))
		}
		body, _ := json.Marshal(map[string]any{"model": c.Model, "prompt": sb.String(), "max_tokens": c.MaxTokens, "stream": true, "temperature": 0})
		sent := time.Since(time.UnixMilli(c.StartUnixMs)).Milliseconds()
		wg.Go(func() {
			rec := oneRequest(ctx, hc, c, body)
			rec.SentMs = sent
			mu.Lock()
			recs = append(recs, rec)
			mu.Unlock()
		})
	}
	wg.Wait()
	enc := json.NewEncoder(w)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// firstModel returns the first model of a /v1/models answer.
func firstModel(models string) (string, error) {
	var v struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(models), &v); err != nil || len(v.Data) == 0 {
		return "", fmt.Errorf("/v1/models: no model (%v): %q", err, models)
	}
	return v.Data[0].ID, nil
}

// oneRequest sends one streamed completion and classifies its end.
func oneRequest(ctx context.Context, hc *http.Client, c clientConfig, body []byte) clientRecord {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(c.TimeoutMs)*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(frontend.HeaderTTFTBudget, strconv.FormatFloat(c.BudgetMs, 'f', -1, 64))
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return clientRecord{Outcome: "lost", Err: err.Error()}
		}
		return clientRecord{Outcome: "conn_err", Err: err.Error()}
	}
	defer resp.Body.Close()
	rec := clientRecord{Status: resp.StatusCode, Served: resp.Header.Get(region.HeaderServed)}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		rec.Outcome, rec.Err = "rejected", strings.TrimSpace(string(b))
		return rec
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	gotToken := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			if !gotToken {
				rec.Outcome, rec.Err = "cut", "[DONE] without a token"
				return rec
			}
			rec.Outcome = "ok"
			return rec
		}
		var ev struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			continue
		}
		if ev.Error != nil {
			rec.Outcome, rec.Err = "cut", ev.Error.Message
			return rec
		}
		if !gotToken && len(ev.Choices) > 0 && ev.Choices[0].Text != "" {
			gotToken = true
			rec.TTFTMs = float64(time.Since(t0).Microseconds()) / 1000
		}
	}
	rec.Outcome, rec.Err = "cut", "stream ended without [DONE]"
	if err := sc.Err(); err != nil {
		rec.Err = err.Error()
	}
	if !gotToken && ctx.Err() != nil {
		rec.Outcome = "lost"
	}
	return rec
}

// writeRegionCerts writes a region CA (ca.crt) and each region's
// certificate and key (NAME.crt, NAME.key), valid for its region address
// as server and client, into dir.
func writeRegionCerts(dir string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pdserve regions lab CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return err
	}
	write := func(name, typ string, der []byte) error {
		return os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
	}
	if err := write("ca.crt", "CERTIFICATE", caDER); err != nil {
		return err
	}
	for i, n := range regionNames {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		leaf := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: "region " + n},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			IPAddresses: []net.IP{net.ParseIP(regionIP(i)), net.ParseIP("127.0.0.1")},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kder, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := write(n+".crt", "CERTIFICATE", der); err != nil {
			return err
		}
		if err := write(n+".key", "PRIVATE KEY", kder); err != nil {
			return err
		}
	}
	return nil
}

// proxyConfig is a delay proxy's task: accept on each pair's first
// address, connect to its second, and pass the bytes both ways each
// DelayUs after they arrived. The lab's kernel may lack netem: the
// links' latency is this proxy's (the TCP handshake itself is not
// delayed; every byte after it is).
type proxyConfig struct {
	Pairs   [][2]string `json:"pairs"`
	DelayUs int64       `json:"delay_us"`
}

// runProxy serves c until a listener fails.
func runProxy(c proxyConfig) error {
	d := time.Duration(c.DelayUs) * time.Microsecond
	errc := make(chan error, len(c.Pairs))
	for _, p := range c.Pairs {
		ln, err := net.Listen("tcp", p[0])
		if err != nil {
			return err
		}
		go func() {
			for {
				in, err := ln.Accept()
				if err != nil {
					errc <- err
					return
				}
				go func() {
					out, err := net.Dial("tcp", p[1])
					if err != nil {
						in.Close()
						return
					}
					done := make(chan struct{})
					go func() { delayCopy(out, in, d); close(done) }()
					delayCopy(in, out, d)
					<-done
					in.Close()
					out.Close()
				}()
			}
		}()
	}
	return <-errc
}

// delayCopy writes to dst what src reads, each chunk d after it was
// read, in order; at src's end it closes dst's write side (or dst).
func delayCopy(dst, src net.Conn, d time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				ch <- chunk{b[:n], time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			_ = src.Close() // unblocks the reader
			break
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	} else {
		_ = dst.Close()
	}
	for range ch {
	}
}
