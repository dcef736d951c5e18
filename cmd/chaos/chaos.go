package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pdserve/pdserve/internal/netlab"
	"github.com/pdserve/pdserve/pkg/decode"
)

var errSkip = errors.New("network namespaces not allowed")

// line is one fault's report.
type line struct {
	Fault         string  `json:"fault"`
	RequestRate   float64 `json:"request_rate"`
	Completed     int     `json:"completed"`
	Failed        int     `json:"failed"`
	Retried       int     `json:"retried"`
	OutputsEqual  bool    `json:"outputs_equal"`
	Compared      int     `json:"compared"` // completed in both runs
	LeakedBlocks  int     `json:"leaked_blocks"`
	RetainedBytes int64   `json:"retained_bytes"`
	// SettleMs is how long after the load the held KV took to drain to
	// leaked_blocks and retained_bytes (0 when it was already there).
	SettleMs         int64 `json:"settle_ms"`
	GoroutinesBefore int   `json:"goroutines_before"`
	GoroutinesAfter  int   `json:"goroutines_after"`
}

type opts struct {
	bin      string
	prompts  int
	linkGbps float64
	tmp      string
}

func chaosMain(ctx context.Context, args []string) (int, error) {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	var o opts
	fs.StringVar(&o.bin, "bin", "", "directory of coordinator, prefill-worker, decode-worker and loadtest")
	faults := fs.String("faults", "kill-decode,stop-decode,kill-prefill,partition", "faults to inject, comma separated: kill-decode, stop-decode, kill-prefill, partition")
	fs.IntVar(&o.prompts, "prompts", 40, "requests of the capacity run")
	dur := fs.Duration("duration", 6*time.Second, "length of each fault run's load (prompts = 0.7 × capacity × duration)")
	fs.Float64Var(&o.linkGbps, "link-gbps", 1, "rate of the prefill worker's link (tc tbf)")
	if err := fs.Parse(args); err != nil {
		return 1, err
	}
	if o.bin == "" {
		return 1, errors.New("--bin is required")
	}
	for _, f := range strings.Split(*faults, ",") {
		if _, ok := faultFuncs[f]; !ok {
			return 1, fmt.Errorf("--faults: unknown fault %q", f)
		}
	}
	if err := netlab.Supported(ctx); err != nil {
		if errors.Is(err, netlab.ErrUnsupported) && !(os.Getenv("CI") == "true" && os.Geteuid() == 0) {
			return 1, fmt.Errorf("%w: %v", errSkip, err)
		}
		return 1, err
	}
	tmp, err := os.MkdirTemp("", "pdserve-chaos-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(tmp)
	o.tmp = tmp

	// Capacity: a closed loop of 8 requests in flight.
	capRes, err := o.runOnce(ctx, "capacity", "inf", 8, nil)
	if err != nil {
		return 1, fmt.Errorf("capacity run: %w", err)
	}
	rate := 0.7 * capRes.throughput
	rateArg := strconv.FormatFloat(rate, 'f', 3, 64)
	o.prompts = max(20, int(rate*dur.Seconds()))
	faultAt = *dur / 3
	ref, err := o.runOnce(ctx, "none", rateArg, 0, nil)
	if err != nil {
		return 1, fmt.Errorf("no-fault run: %w", err)
	}
	code := 0
	report := func(name string, r *runResult) error {
		l := line{Fault: name, RequestRate: rate, Completed: r.completed, Failed: r.failed, Retried: r.retried,
			LeakedBlocks: r.leakedBlocks, RetainedBytes: r.retained, SettleMs: r.settle.Milliseconds(), GoroutinesBefore: r.goBefore, GoroutinesAfter: r.goAfter}
		l.OutputsEqual = true
		for i := range r.texts {
			if r.errs[i] == "" && i < len(ref.texts) && ref.errs[i] == "" {
				l.Compared++
				if r.texts[i] != ref.texts[i] {
					l.OutputsEqual = false
				}
			}
		}
		if !l.OutputsEqual || l.LeakedBlocks != 0 || l.RetainedBytes != 0 {
			code = 2
		}
		b, _ := json.Marshal(l)
		fmt.Println(string(b))
		return nil
	}
	if err := report("none", ref); err != nil {
		return 1, err
	}
	for _, f := range strings.Split(*faults, ",") {
		r, err := o.runOnce(ctx, f, rateArg, 0, faultFuncs[f])
		if err != nil {
			return 1, fmt.Errorf("fault %s: %w", f, err)
		}
		if err := report(f, r); err != nil {
			return 1, err
		}
	}
	return code, nil
}

// cluster is one deployment on a fresh Lab.
type cluster struct {
	lab      *netlab.Lab
	coordURL string
	procs    map[string]*exec.Cmd
	metrics  map[string]string // worker id → /metrics URL
	decodes  []string          // decode worker ids
	prefills []string          // prefill worker ids
	coordNS  *netlab.Namespace
	ns       map[string]*netlab.Namespace // by process id
	addr     map[string]string            // each namespace's address, by process id
}

// fault is injected into c a moment into the load; it returns the ids of
// the workers it killed (their metrics are gone).
type fault func(ctx context.Context, c *cluster) ([]string, error)

// faultAt is when a fault hits, from the start of the load.
var faultAt = 1500 * time.Millisecond

var faultFuncs = map[string]fault{
	// kill -9 a decode worker a third into the load: transfers to it and
	// decodes on it are in flight.
	"kill-decode": func(ctx context.Context, c *cluster) ([]string, error) {
		if err := sleep(ctx, faultAt); err != nil {
			return nil, err
		}
		id := c.decodes[1]
		return []string{id}, c.procs[id].Process.Signal(syscall.SIGKILL)
	},
	// kill -9 a prefill worker a third into the load: prefills on it are
	// in flight; the coordinator retries those that sent no token yet on
	// the other prefill worker.
	"kill-prefill": func(ctx context.Context, c *cluster) ([]string, error) {
		if err := sleep(ctx, faultAt); err != nil {
			return nil, err
		}
		id := c.prefills[1]
		return []string{id}, c.procs[id].Process.Signal(syscall.SIGKILL)
	},
	// Partition a prefill worker from both decode workers for 5 s: a
	// blackhole route in its namespace to each decode address drops its
	// KV streams' packets (the coordinator and NATS still reach it).
	"partition": func(ctx context.Context, c *cluster) ([]string, error) {
		if err := sleep(ctx, faultAt); err != nil {
			return nil, err
		}
		id := c.prefills[1]
		route := func(verb string) error {
			for _, d := range c.decodes {
				if out, err := c.ns[id].Command(ctx, "ip", "route", verb, "blackhole", c.addr[d]+"/32").CombinedOutput(); err != nil {
					return fmt.Errorf("partition %s from %s: ip route %s: %v: %s", id, d, verb, err, out)
				}
			}
			return nil
		}
		if err := route("add"); err != nil {
			return nil, err
		}
		// The cut must hold: a decode worker's metrics port is out of
		// reach from the prefill worker's namespace.
		probe := c.ns[id].Command(ctx, "curl", "-sf", "--max-time", "1", "http://"+net.JoinHostPort(c.addr[c.decodes[0]], "9200")+"/metrics")
		if probe.Run() == nil {
			_ = route("del")
			return nil, fmt.Errorf("partition %s: %s still reachable", id, c.decodes[0])
		}
		err := sleep(ctx, 4*time.Second)
		if herr := route("del"); herr != nil && err == nil {
			err = herr
		}
		return nil, err
	},
	// SIGSTOP a decode worker for 10 s, then SIGCONT.
	"stop-decode": func(ctx context.Context, c *cluster) ([]string, error) {
		if err := sleep(ctx, faultAt); err != nil {
			return nil, err
		}
		p := c.procs[c.decodes[1]].Process
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			return nil, err
		}
		err := sleep(ctx, 10*time.Second)
		_ = p.Signal(syscall.SIGCONT)
		return nil, err
	},
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type runResult struct {
	throughput        float64
	completed, failed int
	retried           int
	texts, errs       []string
	leakedBlocks      int
	retained          int64
	settle            time.Duration
	goBefore, goAfter int
}

// runOnce starts a cluster, runs the loadtest (rate, concurrency) with f
// injected alongside, lets it settle and reads what every live worker
// still holds.
func (o *opts) runOnce(ctx context.Context, name, rate string, conc int, f fault) (*runResult, error) {
	c, err := o.start(ctx)
	if c != nil {
		defer c.lab.Close()
	}
	if err != nil {
		return nil, err
	}
	res := &runResult{}
	res.goBefore = c.goroutines(ctx, nil)
	resFile := name + ".json"
	lt := c.coordNS.Command(ctx, filepath.Join(o.bin, "loadtest"), "run", "--base-url", c.coordURL, "--quiet", "--no-plots",
		"--seed", "1", "--temperature", "0", "--num-prompts", strconv.Itoa(o.prompts),
		"--random-input-len", "256", "--random-output-len", "48", "--request-rate", rate,
		"--max-concurrency", strconv.Itoa(conc), "--request-timeout", "60s",
		"--save-result", "--save-detailed", "--result-dir", o.tmp, "--result-filename", resFile)
	var ltOut strings.Builder
	lt.Stdout, lt.Stderr = &ltOut, &ltOut
	if err := c.lab.Start(lt); err != nil {
		return nil, err
	}
	var dead []string
	ferr := make(chan error, 1)
	if f != nil {
		go func() {
			var err error
			dead, err = f(ctx, c)
			ferr <- err
		}()
	} else {
		ferr <- nil
	}
	werr := lt.Wait()
	if err := <-ferr; err != nil {
		return nil, err
	}
	for _, id := range dead {
		if _, err := c.get(ctx, c.metrics[id]); err == nil {
			return nil, fmt.Errorf("%s still answers after the fault killed it", id)
		}
	}
	if werr != nil {
		return nil, fmt.Errorf("loadtest: %v: %s", werr, ltOut.String())
	}
	var r struct {
		Completed  int      `json:"completed"`
		Failed     int      `json:"failed"`
		Throughput float64  `json:"request_throughput"`
		Texts      []string `json:"generated_texts"`
		Errors     []string `json:"errors"`
	}
	b, err := os.ReadFile(filepath.Join(o.tmp, resFile))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	res.completed, res.failed, res.throughput, res.texts, res.errs = r.Completed, r.Failed, r.Throughput, r.Texts, r.Errors
	// Settle: held KV must drain back within the decode workers'
	// reservation TTL and a margin. A request whose Cancel could not reach
	// a worker (stopped, partitioned) keeps its reservation there until the
	// TTL ends it: bounded, not leaked.
	t0 := time.Now()
	deadline := t0.Add(decode.DefaultOptions().ReserveTTL + 5*time.Second)
	for {
		res.leakedBlocks, res.retained = c.held(ctx, dead)
		res.settle = time.Since(t0)
		if (res.leakedBlocks == 0 && res.retained == 0) || time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return nil, err
		}
	}
	res.goAfter = c.goroutines(ctx, dead)
	res.retried = int(c.sum(ctx, "pdserve_decode_recoveries_total", dead) + c.sum(ctx, "pdserve_prefill_retries_total", dead))
	return res, nil
}

// start builds a Lab (a switch; namespaces coord, prefill, decode-0,
// decode-1, the prefill link shaped) and starts the processes with NATS
// users of their own.
func (o *opts) start(ctx context.Context) (*cluster, error) {
	lab, err := netlab.New(ctx)
	if err != nil {
		return nil, err
	}
	c := &cluster{lab: lab, procs: map[string]*exec.Cmd{}, metrics: map[string]string{}}
	sw, err := lab.AddSwitch(ctx, "hub")
	if err != nil {
		return c, err
	}
	addr := map[string]string{}
	nss := map[string]*netlab.Namespace{}
	for _, n := range []string{"coord", "prefill-0", "prefill-1", "decode-0", "decode-1"} {
		ns, err := lab.AddNamespace(ctx, n)
		if err != nil {
			return c, err
		}
		sh := netlab.Shape{}
		if strings.HasPrefix(n, "prefill-") {
			sh.RateBitsPerSec = o.linkGbps * 1e9
		}
		k, err := sw.Attach(ctx, ns, sh)
		if err != nil {
			return c, err
		}
		addr[n], nss[n] = k.AddrA.String(), ns
	}
	c.coordNS, c.ns, c.addr = nss["coord"], nss, addr
	pw := map[string]string{}
	for _, u := range []string{"prefill", "decode"} {
		var b [16]byte
		_, _ = rand.Read(b[:])
		pw[u] = hex.EncodeToString(b[:])
		if err := os.WriteFile(filepath.Join(o.tmp, u+".pw"), []byte(pw[u]), 0o600); err != nil {
			return c, err
		}
	}
	users := fmt.Sprintf("users:\n  - {user: prefill, password: %s, role: prefill}\n  - {user: decode, password: %s, role: decode}\n", pw["prefill"], pw["decode"])
	if err := os.WriteFile(filepath.Join(o.tmp, "users.yaml"), []byte(users), 0o600); err != nil {
		return c, err
	}
	logf, err := os.OpenFile(filepath.Join(o.tmp, "procs.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return c, err
	}
	defer logf.Close()
	startProc := func(id, ns string, bin string, args ...string) error {
		cmd := nss[ns].Command(ctx, filepath.Join(o.bin, bin), args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := lab.Start(cmd); err != nil {
			return err
		}
		c.procs[id] = cmd
		go func() { _ = cmd.Wait() }()
		return nil
	}
	natsURL := "nats://" + net.JoinHostPort(addr["coord"], "4222")
	c.coordURL = "http://" + net.JoinHostPort(addr["coord"], "8080")
	if err := startProc("coordinator", "coord", "coordinator", "--http-addr", net.JoinHostPort(addr["coord"], "8080"),
		"--nats-listen", net.JoinHostPort(addr["coord"], "4222"), "--nats-auth-file", filepath.Join(o.tmp, "users.yaml"),
		"--log-level", "warn"); err != nil {
		return c, err
	}
	if err := c.waitHTTP(ctx, c.coordURL+"/healthz"); err != nil {
		return c, fmt.Errorf("coordinator: %w", err)
	}
	coordMetrics := c.coordURL + "/metrics"
	worker := func(id, bin, user string, extra ...string) error {
		a := addr[id]
		c.metrics[id] = "http://" + net.JoinHostPort(a, "9200") + "/metrics"
		args := append([]string{"--id", id, "--nats-url", natsURL, "--nats-user", user, "--nats-password-file", filepath.Join(o.tmp, user+".pw"),
			"--grpc-addr", net.JoinHostPort(a, "9100"), "--metrics-addr", net.JoinHostPort(a, "9200"), "--log-level", "warn"}, extra...)
		return startProc(id, id, bin, args...)
	}
	for _, id := range []string{"prefill-0", "prefill-1"} {
		if err := worker(id, "prefill-worker", "prefill"); err != nil {
			return c, err
		}
		c.prefills = append(c.prefills, id)
	}
	for _, id := range []string{"decode-0", "decode-1"} {
		if err := worker(id, "decode-worker", "decode"); err != nil {
			return c, err
		}
		c.decodes = append(c.decodes, id)
	}
	for id, u := range c.metrics {
		if err := c.waitHTTP(ctx, strings.TrimSuffix(u, "/metrics")+"/readyz"); err != nil {
			return c, fmt.Errorf("%s: %w", id, err)
		}
	}
	if err := c.waitHTTP(ctx, c.coordURL+"/readyz"); err != nil {
		return c, fmt.Errorf("coordinator: %w", err)
	}
	c.metrics["coordinator"] = coordMetrics // retries, goroutines
	// Every worker's heartbeats reach the coordinator within a second or two.
	return c, sleep(ctx, 2500*time.Millisecond)
}

// get fetches u from inside the coordinator's namespace (the harness's
// own namespace has no route to the lab).
func (c *cluster) get(ctx context.Context, u string) (string, error) {
	cmd := c.coordNS.Command(ctx, "curl", "-sf", "--max-time", "2", u)
	out, err := cmd.Output()
	return string(out), err
}

func (c *cluster) waitHTTP(ctx context.Context, u string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.get(ctx, u)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready in 30 s: %v", u, err)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// sum adds up every sample of metric over the live workers.
func (c *cluster) sum(ctx context.Context, metric string, dead []string) float64 {
	total := 0.0
	for id, u := range c.metrics {
		if contains(dead, id) {
			continue
		}
		total += scrape(c, ctx, u)[metric]
	}
	return total
}

// held returns Σ (total − free) KV blocks over the live decode workers
// and Σ prefill retained bytes.
func (c *cluster) held(ctx context.Context, dead []string) (int, int64) {
	blocks, bytes := 0, int64(0)
	for id, u := range c.metrics {
		if contains(dead, id) {
			continue
		}
		m := scrape(c, ctx, u)
		blocks += int(m["pdserve_kv_blocks_total"] - m["pdserve_kv_blocks_free"])
		bytes += int64(m["pdserve_prefill_retained_bytes"])
	}
	return blocks, bytes
}

func (c *cluster) goroutines(ctx context.Context, dead []string) int {
	return int(c.sum(ctx, "go_goroutines", dead))
}

// scrape returns the sum per metric name of a Prometheus text page.
func scrape(c *cluster, ctx context.Context, u string) map[string]float64 {
	out := map[string]float64{}
	body, err := c.get(ctx, u)
	if err != nil {
		return out
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(f[0], "{")
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			out[name] += v
		}
	}
	return out
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
