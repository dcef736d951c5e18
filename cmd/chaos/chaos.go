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
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/internal/netlab"
	"github.com/pdserve/pdserve/pkg/coordinator"
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
	// FaultAt is the victim's gauges when the fault struck (kill-decode-*:
	// pdserve_decode_kv_transfers and pdserve_decode_running) and whether
	// the fault's condition held ("met" 1) or its wait ran out (0).
	FaultAt map[string]float64 `json:"fault_at,omitempty"`
	// GoroutinesAfterRepeat (the no-fault run only): after the same load
	// once more on the same processes; equal to goroutines_after when what
	// the first load left is pools (connections), not a leak per request.
	GoroutinesAfterRepeat int `json:"goroutines_after_repeat,omitempty"`
	// RecoveredTokensSent has one entry per request the coordinator moved
	// to another decode worker: the tokens the client had received when
	// the worker failed (0 or 1: during the KV transfer, the 1 being the
	// prefill worker's first token; more: mid-decode), from its log.
	RecoveredTokensSent []int `json:"recovered_tokens_sent"`
	// Rejected counts 429 answers. SLOAttainment is the share of all
	// requests within the SLO (--slo-ttft-ms, --slo-tpot-ms),
	// AdmittedSLOAttainment that of the completed ones; p99 TTFT and mean
	// TPOT are over completed requests.
	Rejected              int     `json:"rejected_429"`
	SLOAttainment         float64 `json:"slo_attainment"`
	AdmittedSLOAttainment float64 `json:"admitted_slo_attainment"`
	P99TTFTMs             float64 `json:"p99_ttft_ms"`
	MeanTPOTMs            float64 `json:"mean_tpot_ms"`
	// The KV transfer per request from the budgets: exposed (after the
	// prefill ended) and the whole stream, means in ms.
	MeanKVTransferMs float64 `json:"mean_kv_transfer_ms"`
	P99KVTransferMs  float64 `json:"p99_kv_transfer_ms"`
	MeanKVStreamMs   float64 `json:"mean_kv_stream_ms"`
	// PeakRSSMiB is each process's peak resident memory (VmHWM) at the
	// end of the run; a restarted process counts from its restart.
	PeakRSSMiB map[string]float64 `json:"peak_rss_mib"`
}

type opts struct {
	bin         string
	self        string // this binary, run as the NATS server (chaos nats)
	prompts     int
	linkGbps    float64
	tmp         string
	engineFlags []string
	sloTTFTMs   float64
	sloTPOTMs   float64
	overloadX   float64
	outputLen   int
	// overloadQueue is the coordinator's limits.queue_limit in the overload
	// run: the requests it admits at once.
	overloadQueue int
}

func chaosMain(ctx context.Context, args []string) (int, error) {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	var o opts
	fs.StringVar(&o.bin, "bin", "", "directory of coordinator, prefill-worker, decode-worker and loadtest")
	faults := fs.String("faults", "kill-decode-transfer,kill-decode-decoding,stop-decode,kill-prefill,partition,restart-nats,restart-coordinator,overload", "faults to inject, comma separated (see the package doc; empty: the no-fault run only)")
	fs.IntVar(&o.prompts, "prompts", 40, "requests of the capacity run")
	dur := fs.Duration("duration", 6*time.Second, "length of each fault run's load (prompts = 0.7 × capacity × duration)")
	fs.Float64Var(&o.linkGbps, "link-gbps", 1, "rate of the prefill workers' links (tc tbf)")
	eflags := fs.String("engine-flags", "", "engine flags for the coordinator and every worker, space separated (e.g. \"--engine sim --profile h100/llama-3-8b/tp1\"; empty: the ref engine's tiny model)")
	fs.Float64Var(&o.sloTTFTMs, "slo-ttft-ms", 1000, "TTFT SLO of slo_attainment, ms")
	fs.Float64Var(&o.sloTPOTMs, "slo-tpot-ms", 100, "TPOT SLO of slo_attainment, ms")
	fs.IntVar(&o.outputLen, "output-len", 256, "output tokens per request (long enough that a kill mid-decode finds requests mid-way)")
	fs.Float64Var(&o.overloadX, "overload-x", 10, "overload: the offered rate as a multiple of the measured capacity")
	fs.IntVar(&o.overloadQueue, "overload-queue-limit", 32, "overload: the coordinator's policy limits.queue_limit (requests admitted at once; the closed-loop capacity run keeps 8 in flight)")
	if err := fs.Parse(args); err != nil {
		return 1, err
	}
	o.engineFlags = strings.Fields(*eflags)
	self, err := os.Executable()
	if err != nil {
		return 1, err
	}
	o.self = self
	if o.bin == "" {
		return 1, errors.New("--bin is required")
	}
	faultList := strings.FieldsFunc(*faults, func(r rune) bool { return r == ',' })
	for _, f := range faultList {
		if _, ok := faultFuncs[f]; !ok && f != "overload" {
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
	capRes, err := o.runOnce(ctx, load{name: "capacity", rate: math.Inf(1), prompts: o.prompts, conc: 8})
	if err != nil {
		return 1, fmt.Errorf("capacity run: %w", err)
	}
	rate := 0.7 * capRes.throughput
	base := load{rate: rate, prompts: max(20, int(rate*dur.Seconds()))}
	faultAt = *dur / 3
	none := base
	none.name, none.repeat = "none", true
	ref, err := o.runOnce(ctx, none)
	if err != nil {
		return 1, fmt.Errorf("no-fault run: %w", err)
	}
	code := 0
	report := func(r *runResult) {
		l := line{Fault: r.name, RequestRate: r.rate, Completed: r.completed, Failed: r.failed, Retried: r.retried,
			LeakedBlocks: r.leakedBlocks, RetainedBytes: r.retained, SettleMs: r.settle.Milliseconds(), GoroutinesBefore: r.goBefore, GoroutinesAfter: r.goAfter,
			FaultAt: r.faultAt, GoroutinesAfterRepeat: r.goAfterRepeat, RecoveredTokensSent: r.recoveredTokens,
			Rejected: r.rejected, SLOAttainment: r.attainment, AdmittedSLOAttainment: r.admittedAttainment, P99TTFTMs: r.p99TTFT, MeanTPOTMs: r.meanTPOT,
			MeanKVTransferMs: r.meanKVTransfer, P99KVTransferMs: r.p99KVTransfer, MeanKVStreamMs: r.meanKVStream, PeakRSSMiB: r.peakRSS}
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
	}
	report(ref)
	for _, f := range faultList {
		run := base
		run.name, run.fault = f, faultFuncs[f]
		if f == "overload" {
			// The same requests' outputs compare; the extra ones are
			// new prompts (the loadtest's seeded dataset extends).
			run.rate = o.overloadX * capRes.throughput
			run.prompts = max(base.prompts, int(run.rate*dur.Seconds()))
			run.queueLimit = o.overloadQueue
		}
		r, err := o.runOnce(ctx, run)
		if err != nil {
			return 1, fmt.Errorf("fault %s: %w", f, err)
		}
		report(r)
	}
	return code, nil
}

// load is one run's load and fault.
type load struct {
	name       string
	rate       float64 // req/s; +Inf: a closed loop of conc
	prompts    int
	conc       int   // max concurrency (0: none)
	queueLimit int   // the coordinator's limits.queue_limit (0: its default)
	fault      fault // nil: none
	repeat     bool  // run the load a second time, for goroutines_after_repeat
}

// cluster is one deployment on a fresh Lab.
type cluster struct {
	lab      *netlab.Lab
	logf     *os.File // the run's processes' log
	logPath  string
	coordURL string
	procs    map[string]*proc  // by process id
	metrics  map[string]string // process id → /metrics URL
	decodes  []string          // decode worker ids
	prefills []string          // prefill worker ids
	coordNS  *netlab.Namespace
	ns       map[string]*netlab.Namespace // by process id
	addr     map[string]string            // each namespace's address, by process id
}

// proc is a running process of the cluster and how to start it again.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	ns     string
	bin    string
	args   []string
}

func (c *cluster) close() {
	_ = c.lab.Close()
	if c.logf != nil {
		_ = c.logf.Close()
	}
}

// startProc starts bin (a path) with args in the namespace of ns as the
// process id, replacing an earlier one of that id.
func (c *cluster) startProc(ctx context.Context, id, ns, bin string, args ...string) error {
	cmd := c.ns[ns].Command(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = c.logf, c.logf
	if err := c.lab.Start(cmd); err != nil {
		return err
	}
	p := &proc{cmd: cmd, exited: make(chan struct{}), ns: ns, bin: bin, args: args}
	c.procs[id] = p
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return nil
}

// kill sends SIGKILL to id and waits until it has exited.
func (c *cluster) kill(ctx context.Context, id string) error {
	p := c.procs[id]
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s: %w", id, err)
	}
	select {
	case <-p.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// restart starts id again with the arguments it was started with.
func (c *cluster) restart(ctx context.Context, id string) error {
	p := c.procs[id]
	return c.startProc(ctx, id, p.ns, p.bin, p.args...)
}

// fault is injected into c a moment into the load.
type fault func(ctx context.Context, c *cluster) (faultResult, error)

// faultResult: the ids of the workers the fault killed (their metrics are
// gone), and the victim's gauges when it struck.
type faultResult struct {
	dead []string
	at   map[string]float64
}

// settleTTL is the workers' --reserve-ttl and --retain-ttl here: what a
// dead or unreachable coordinator leaves on them is bounded by it.
const settleTTL = 20 * time.Second

// faultAt is when a fault hits, from the start of the load.
var faultAt = 1500 * time.Millisecond

// killDecodeWhen kills decode-1 once its gauges satisfy cond (polled every
// 10 ms, for at most 5 s after faultAt; "met" in the result says whether
// cond held or the wait ran out).
func killDecodeWhen(cond func(m map[string]float64) bool) fault {
	return func(ctx context.Context, c *cluster) (faultResult, error) {
		if err := sleep(ctx, faultAt); err != nil {
			return faultResult{}, err
		}
		id := c.decodes[1]
		deadline := time.Now().Add(5 * time.Second)
		var m map[string]float64
		met := false
		for !met && time.Now().Before(deadline) {
			m = scrape(c, ctx, c.metrics[id])
			if met = cond(m); !met {
				if err := sleep(ctx, 10*time.Millisecond); err != nil {
					return faultResult{}, err
				}
			}
		}
		at := map[string]float64{"kv_transfers": m["pdserve_decode_kv_transfers"], "running": m["pdserve_decode_running"], "met": 0}
		if met {
			at["met"] = 1
		}
		return faultResult{dead: []string{id}, at: at}, c.kill(ctx, id)
	}
}

var faultFuncs = map[string]fault{
	// kill -9 a decode worker while KV is arriving at it (an open
	// transfer): the coordinator moves the request to the other decode
	// worker, whose KV the prefill worker re-sends.
	"kill-decode-transfer": killDecodeWhen(func(m map[string]float64) bool { return m["pdserve_decode_kv_transfers"] >= 1 }),
	// kill -9 a decode worker that is decoding and receives no KV at that
	// moment: its requests resume on the other one from the tokens sent.
	"kill-decode-decoding": killDecodeWhen(func(m map[string]float64) bool {
		return m["pdserve_decode_running"] >= 1 && m["pdserve_decode_kv_transfers"] == 0
	}),
	// kill -9 a prefill worker a third into the load: prefills on it are
	// in flight; the coordinator retries those that sent no token yet on
	// the other prefill worker.
	"kill-prefill": func(ctx context.Context, c *cluster) (faultResult, error) {
		if err := sleep(ctx, faultAt); err != nil {
			return faultResult{}, err
		}
		id := c.prefills[1]
		return faultResult{dead: []string{id}}, c.kill(ctx, id)
	},
	// Partition a prefill worker from both decode workers for 5 s: a
	// blackhole route in its namespace to each decode address drops its
	// KV streams' packets (the coordinator and NATS still reach it).
	"partition": func(ctx context.Context, c *cluster) (faultResult, error) {
		if err := sleep(ctx, faultAt); err != nil {
			return faultResult{}, err
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
			return faultResult{}, err
		}
		// The cut must hold: a decode worker's metrics port is out of
		// reach from the prefill worker's namespace.
		probe := c.ns[id].Command(ctx, "curl", "-sf", "--max-time", "1", "http://"+net.JoinHostPort(c.addr[c.decodes[0]], "9200")+"/metrics")
		if probe.Run() == nil {
			_ = route("del")
			return faultResult{}, fmt.Errorf("partition %s: %s still reachable", id, c.decodes[0])
		}
		err := sleep(ctx, 4*time.Second)
		if herr := route("del"); herr != nil && err == nil {
			err = herr
		}
		return faultResult{}, err
	},
	// SIGSTOP a decode worker for 10 s, then SIGCONT.
	"stop-decode": func(ctx context.Context, c *cluster) (faultResult, error) {
		if err := sleep(ctx, faultAt); err != nil {
			return faultResult{}, err
		}
		p := c.procs[c.decodes[1]].cmd.Process
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			return faultResult{}, err
		}
		err := sleep(ctx, 10*time.Second)
		_ = p.Signal(syscall.SIGCONT)
		return faultResult{}, err
	},
	// kill -9 the NATS server and start it again 3 s later at the same
	// address: heartbeats stop meanwhile; the coordinator keeps its
	// membership while it cannot hear, and every client reconnects.
	"restart-nats": func(ctx context.Context, c *cluster) (faultResult, error) {
		if err := sleep(ctx, faultAt); err != nil {
			return faultResult{}, err
		}
		if err := c.kill(ctx, "nats"); err != nil {
			return faultResult{}, err
		}
		if err := sleep(ctx, 3*time.Second); err != nil {
			return faultResult{}, err
		}
		return faultResult{}, c.restart(ctx, "nats")
	},
	// kill -9 the coordinator and start it again at once (a pod restart):
	// its requests in flight fail with it, and so do those that arrive
	// before it serves again; the workers free what the dead one held.
	"restart-coordinator": func(ctx context.Context, c *cluster) (faultResult, error) {
		if err := sleep(ctx, faultAt); err != nil {
			return faultResult{}, err
		}
		if err := c.kill(ctx, "coordinator"); err != nil {
			return faultResult{}, err
		}
		if err := c.restart(ctx, "coordinator"); err != nil {
			return faultResult{}, err
		}
		return faultResult{}, c.waitHTTP(ctx, c.coordURL+"/readyz")
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
	name                        string
	rate                        float64
	throughput                  float64
	completed, failed           int
	retried                     int
	texts, errs                 []string
	leakedBlocks                int
	retained                    int64
	settle                      time.Duration
	goBefore, goAfter           int
	goAfterRepeat               int
	faultAt                     map[string]float64
	recoveredTokens             []int
	rejected                    int
	attainment                  float64
	admittedAttainment          float64
	p99TTFT, meanTPOT           float64
	meanKVTransfer              float64
	p99KVTransfer, meanKVStream float64
	peakRSS                     map[string]float64
}

// runOnce starts a cluster, runs the loadtest l with l.fault injected
// alongside, lets it settle and reads what every live worker still holds.
func (o *opts) runOnce(ctx context.Context, l load) (*runResult, error) {
	c, err := o.start(ctx, l)
	if c != nil {
		defer c.close()
	}
	if err != nil {
		return nil, err
	}
	res := &runResult{name: l.name, rate: l.rate}
	res.goBefore = c.goroutines(ctx, nil)
	resFile := l.name + ".json"
	rate := "inf"
	if !math.IsInf(l.rate, 1) {
		rate = strconv.FormatFloat(l.rate, 'f', 3, 64)
	}
	var ltOut strings.Builder
	loadtest := func(file string) *exec.Cmd {
		lt := c.coordNS.Command(ctx, filepath.Join(o.bin, "loadtest"), "run", "--base-url", c.coordURL, "--quiet", "--no-plots",
			"--seed", "1", "--temperature", "0", "--num-prompts", strconv.Itoa(l.prompts),
			"--random-input-len", "256", "--random-output-len", strconv.Itoa(o.outputLen), "--request-rate", rate,
			"--max-concurrency", strconv.Itoa(l.conc), "--request-timeout", "60s",
			"--goodput", fmt.Sprintf("ttft:%g tpot:%g", o.sloTTFTMs, o.sloTPOTMs),
			"--save-result", "--save-detailed", "--result-dir", o.tmp, "--result-filename", file)
		lt.Stdout, lt.Stderr = &ltOut, &ltOut
		return lt
	}
	lt := loadtest(resFile)
	if err := c.lab.Start(lt); err != nil {
		return nil, err
	}
	var fr faultResult
	ferr := make(chan error, 1)
	if l.fault != nil {
		go func() {
			var err error
			fr, err = l.fault(ctx, c)
			ferr <- err
		}()
	} else {
		ferr <- nil
	}
	werr := lt.Wait()
	if err := <-ferr; err != nil {
		return nil, err
	}
	dead := fr.dead
	res.faultAt = fr.at
	for _, id := range dead {
		if _, err := c.get(ctx, c.metrics[id]); err == nil {
			return nil, fmt.Errorf("%s still answers after the fault killed it", id)
		}
	}
	if werr != nil {
		return nil, fmt.Errorf("loadtest: %v: %s", werr, ltOut.String())
	}
	var r struct {
		Completed     int      `json:"completed"`
		Failed        int      `json:"failed"`
		Throughput    float64  `json:"request_throughput"`
		Texts         []string `json:"generated_texts"`
		Errors        []string `json:"errors"`
		SLOAttainment float64  `json:"slo_attainment"`
		P99TTFT       float64  `json:"p99_ttft_ms"`
		MeanTPOT      float64  `json:"mean_tpot_ms"`
		PDServe       struct {
			MeanKVTransfer float64 `json:"mean_kv_transfer_ms"`
			P99KVTransfer  float64 `json:"p99_kv_transfer_ms"`
			MeanKVStream   float64 `json:"mean_kv_stream_ms"`
		} `json:"pdserve"`
	}
	b, err := os.ReadFile(filepath.Join(o.tmp, resFile))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	res.completed, res.failed, res.throughput, res.texts, res.errs = r.Completed, r.Failed, r.Throughput, r.Texts, r.Errors
	res.attainment, res.p99TTFT, res.meanTPOT = r.SLOAttainment, r.P99TTFT, r.MeanTPOT
	if r.Completed > 0 {
		// Failed requests are never within the SLO.
		res.admittedAttainment = r.SLOAttainment * float64(r.Completed+r.Failed) / float64(r.Completed)
	}
	res.meanKVTransfer, res.p99KVTransfer, res.meanKVStream = r.PDServe.MeanKVTransfer, r.PDServe.P99KVTransfer, r.PDServe.MeanKVStream
	for _, e := range r.Errors {
		if strings.HasPrefix(e, "HTTP 429") {
			res.rejected++
		}
	}
	// Settle: held KV must drain back within the decode workers'
	// reservation TTL and a margin. A request whose Cancel could not reach
	// a worker (stopped, partitioned) keeps its reservation there until the
	// TTL ends it: bounded, not leaked.
	t0 := time.Now()
	deadline := t0.Add(settleTTL + 5*time.Second)
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
	if res.recoveredTokens, err = c.recoveries(); err != nil {
		return nil, err
	}
	if l.repeat {
		lt := loadtest("repeat-" + resFile)
		if err := c.lab.Start(lt); err != nil {
			return nil, err
		}
		if err := lt.Wait(); err != nil {
			return nil, fmt.Errorf("loadtest (repeat): %v: %s", err, ltOut.String())
		}
		if err := sleep(ctx, time.Second); err != nil {
			return nil, err
		}
		res.goAfterRepeat = c.goroutines(ctx, dead)
	}
	res.peakRSS = c.peakRSS(dead)
	return res, nil
}

// recoveries returns, per "recovering the request" line of the run's
// coordinator log, the tokens the client had received (tokens_sent).
func (c *cluster) recoveries() ([]int, error) {
	f, err := os.Open(c.logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := []int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Msg        string `json:"msg"`
			TokensSent *int   `json:"tokens_sent"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == recoveringMsg && l.TokensSent != nil {
			out = append(out, *l.TokensSent)
		}
	}
	return out, sc.Err()
}

// recoveringMsg is the coordinator's log message of a decode failover
// (pkg/coordinator's startRecovery), with the field tokens_sent.
const recoveringMsg = "decode worker failed; recovering the request"

// peakRSS reads VmHWM of every live process, in MiB.
func (c *cluster) peakRSS(dead []string) map[string]float64 {
	out := map[string]float64{}
	for id, p := range c.procs {
		if contains(dead, id) {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
				if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
					out[id] = math.Round(kb/1024*10) / 10
				}
			}
		}
	}
	return out
}

// start builds a Lab (a switch; namespaces coord, nats, prefill-0,
// prefill-1, decode-0, decode-1, the prefill links shaped) and starts the
// processes with NATS users of their own: the NATS server apart from the
// coordinator, as the chart deploys it.
func (o *opts) start(ctx context.Context, l load) (*cluster, error) {
	lab, err := netlab.New(ctx)
	if err != nil {
		return nil, err
	}
	c := &cluster{lab: lab, procs: map[string]*proc{}, metrics: map[string]string{}}
	sw, err := lab.AddSwitch(ctx, "hub")
	if err != nil {
		return c, err
	}
	c.addr, c.ns = map[string]string{}, map[string]*netlab.Namespace{}
	for _, n := range []string{"coord", "nats", "prefill-0", "prefill-1", "decode-0", "decode-1"} {
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
		c.addr[n], c.ns[n] = k.AddrA.String(), ns
	}
	c.coordNS = c.ns["coord"]
	pw := map[string]string{}
	for _, u := range []string{"coordinator", "prefill", "decode"} {
		var b [16]byte
		_, _ = rand.Read(b[:])
		pw[u] = hex.EncodeToString(b[:])
		if err := os.WriteFile(filepath.Join(o.tmp, u+".pw"), []byte(pw[u]), 0o600); err != nil {
			return c, err
		}
	}
	users := fmt.Sprintf("users:\n  - {user: coordinator, password: %s, role: coordinator}\n  - {user: prefill, password: %s, role: prefill}\n  - {user: decode, password: %s, role: decode}\n",
		pw["coordinator"], pw["prefill"], pw["decode"])
	if err := os.WriteFile(filepath.Join(o.tmp, "users.yaml"), []byte(users), 0o600); err != nil {
		return c, err
	}
	c.logPath = filepath.Join(o.tmp, l.name+".log")
	if c.logf, err = os.Create(c.logPath); err != nil {
		return c, err
	}
	natsAddr := net.JoinHostPort(c.addr["nats"], "4222")
	if err := c.startProc(ctx, "nats", "nats", o.self, "nats", "--listen", natsAddr, "--auth-file", filepath.Join(o.tmp, "users.yaml")); err != nil {
		return c, err
	}
	natsURL := "nats://" + natsAddr
	c.coordURL = "http://" + net.JoinHostPort(c.addr["coord"], "8080")
	coordArgs := []string{"--http-addr", net.JoinHostPort(c.addr["coord"], "8080"),
		"--nats-url", natsURL, "--nats-user", "coordinator", "--nats-password-file", filepath.Join(o.tmp, "coordinator.pw"),
		"--nats-reconnect-wait", "250ms", "--log-level", "warn",
		"--worker-networks", netlab.LabNet.String()} // the workers' addresses: not the default private ranges
	if l.queueLimit > 0 {
		policy := filepath.Join(o.tmp, l.name+"-policy.yaml")
		if err := os.WriteFile(policy, fmt.Appendf(nil, "limits: {queue_limit: %d}\n", l.queueLimit), 0o600); err != nil {
			return c, err
		}
		coordArgs = append(coordArgs, "--policy", policy)
	}
	// The engine flags the coordinator reads outside --standalone (its
	// tokenizer's): it refuses the workers'.
	coordArgs = append(coordArgs, cliflags.Without(o.engineFlags, coordinator.WorkerOnlyFlags)...)
	if err := c.startProc(ctx, "coordinator", "coord", filepath.Join(o.bin, "coordinator"), coordArgs...); err != nil {
		return c, err
	}
	if err := c.waitHTTP(ctx, c.coordURL+"/healthz"); err != nil {
		return c, fmt.Errorf("coordinator: %w", err)
	}
	coordMetrics := c.coordURL + "/metrics"
	worker := func(id, bin, user string, extra ...string) error {
		a := c.addr[id]
		c.metrics[id] = "http://" + net.JoinHostPort(a, "9200") + "/metrics"
		args := append([]string{"--id", id, "--nats-url", natsURL, "--nats-user", user, "--nats-password-file", filepath.Join(o.tmp, user+".pw"),
			"--nats-reconnect-wait", "250ms",
			"--grpc-addr", net.JoinHostPort(a, "9100"), "--metrics-addr", net.JoinHostPort(a, "9200"), "--log-level", "warn"}, extra...)
		args = append(args, o.engineFlags...)
		return c.startProc(ctx, id, id, filepath.Join(o.bin, bin), args...)
	}
	for _, id := range []string{"prefill-0", "prefill-1"} {
		// KV no Release reaches (a coordinator killed mid-request) goes
		// within the settle wait.
		if err := worker(id, "prefill-worker", "prefill", "--retain-ttl", settleTTL.String()); err != nil {
			return c, err
		}
		c.prefills = append(c.prefills, id)
	}
	for _, id := range []string{"decode-0", "decode-1"} {
		if err := worker(id, "decode-worker", "decode", "--reserve-ttl", settleTTL.String()); err != nil {
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
		blocks += int(m["pdserve_kv_blocks_capacity"] - m["pdserve_kv_blocks_free"])
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
