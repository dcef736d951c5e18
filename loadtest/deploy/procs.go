package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/logging"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// childEnv marks a process started by a llama.cpp deployment as one of
// its workers; its value is the worker's role.
const childEnv = "PDSERVE_DEPLOY_WORKER"

// RunChild runs this process as a worker of a llama.cpp deployment and
// exits, when the deployment started it so (the environment says which
// role); otherwise it returns at once. Call it first in main, and in
// TestMain of tests that start llama.cpp deployments: the deployment
// starts its workers by running its own executable again.
func RunChild() {
	role := os.Getenv(childEnv)
	if role == "" {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	o := workerrun.NewDecodeOptions()
	if role == string(control.RolePrefill) {
		o = workerrun.NewPrefillOptions()
	}
	code := runWorker(ctx, role, o, os.Args[1:])
	stop()
	os.Exit(code)
}

// runWorker is a worker binary's main over args (the flags the deployment
// wrote): 2 for bad flags, 1 when the worker failed, 0 after a clean stop.
func runWorker(ctx context.Context, role string, o workerrun.Options, args []string) int {
	fs := flag.NewFlagSet(role+"-worker", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "%s worker: %v\n", role, err)
		return 2
	}
	logger, err := logging.New(o.LogLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s worker: %v\n", role, err)
		return 2
	}
	defer func() { _ = logger.Sync() }()
	if err := workerrun.Run(ctx, o, logger, nil); err != nil {
		logger.Error("worker failed", zap.Error(err))
		return 1
	}
	return 0
}

// Process is a worker process of a llama.cpp deployment.
type Process struct {
	ID   string // worker id, e.g. "prefill-0"
	Role control.Role
	PID  int
	CPUs []int // the cores it is pinned to
}

// proc is a started worker process.
type proc struct {
	Process
	cmd  *exec.Cmd
	log  string // its stderr file
	done chan struct{}
	err  error // set before done closes
}

// procs is a llama.cpp deployment: the coordinator in this process (it
// floats over every core), each worker a process of its own pinned to its
// cores, all on loopback, the coordinator's embedded NATS server with a
// user per worker, gRPC tokens in files only the workers read.
type procs struct {
	*coordinator.Coordinator
	dir   string
	procs []*proc

	stopOnce sync.Once
	stopErr  error
}

// workerCPUs splits s.CPUs among the workers in order: prefill workers
// first, each an equal share; a colocated deployment's one worker takes
// them all.
func (s Spec) workerCPUs() ([][]int, []control.Role, error) {
	var roles []control.Role
	if s.Mode == Colocated {
		roles = []control.Role{control.RoleColocated}
		if s.DecodeWorkers != 1 {
			return nil, nil, fmt.Errorf("%w: a llama.cpp colocated deployment runs one worker on every core, not %d", ErrSpec, s.DecodeWorkers)
		}
	} else {
		for range s.PrefillWorkers {
			roles = append(roles, control.RolePrefill)
		}
		for range s.DecodeWorkers {
			roles = append(roles, control.RoleDecode)
		}
	}
	n := len(roles)
	if n == 0 || len(s.CPUs) == 0 || len(s.CPUs)%n != 0 {
		return nil, nil, fmt.Errorf("%w: %d cores %v do not split evenly among %d workers", ErrSpec, len(s.CPUs), s.CPUs, n)
	}
	seen := map[int]bool{}
	for _, c := range s.CPUs {
		if c < 0 || seen[c] {
			return nil, nil, fmt.Errorf("%w: cores %v: each a distinct number ≥ 0", ErrSpec, s.CPUs)
		}
		seen[c] = true
	}
	k := len(s.CPUs) / n
	out := make([][]int, n)
	for i := range out {
		out[i] = s.CPUs[i*k : (i+1)*k]
	}
	return out, roles, nil
}

// engineArgs are the llama.cpp engine flags of every worker, threads = its
// cores.
func (s Spec) engineArgs(threads int) []string {
	a := []string{"--engine", enginecfg.Llama, "--model", s.Model, "--engine-threads", strconv.Itoa(threads)}
	if s.LlamaLib != "" {
		a = append(a, "--llama-lib", s.LlamaLib)
	}
	if s.CtxSize > 0 {
		a = append(a, "--ctx-size", strconv.Itoa(s.CtxSize))
	}
	if s.MaxSeqs > 0 {
		a = append(a, "--max-seqs", strconv.Itoa(s.MaxSeqs))
	}
	if s.NoRepack {
		a = append(a, "--no-repack")
	}
	return a
}

// stepArgs are the worker's step-budget and KV flags of s.
func (s Spec) stepArgs(role control.Role) []string {
	var a []string
	add := func(flag string, v int) {
		if v > 0 {
			a = append(a, flag, strconv.Itoa(v))
		}
	}
	add("--chunk-tokens", s.ChunkTokens)
	add("--max-batch-tokens", s.MaxBatchTokens)
	if role == control.RolePrefill {
		if s.Codec != "" {
			a = append(a, "--codec", s.Codec)
		}
		if s.LinkGbps > 0 {
			a = append(a, "--pace-gbps", strconv.FormatFloat(s.LinkGbps, 'g', -1, 64))
		}
		return a
	}
	a = append(a, "--role", string(role))
	add("--max-batch", s.MaxBatch)
	add("--kv-blocks", s.KVBlocks)
	return a
}

func secret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// startProcs starts a llama.cpp deployment (see procs) from o, the
// coordinator's options without Standalone. What was started is stopped
// again on an error.
func startProcs(ctx context.Context, s Spec, o coordinator.Options, log *zap.Logger) (_ *procs, err error) {
	cpus, roles, err := s.workerCPUs()
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("deploy: own executable: %w", err)
	}
	dir, err := os.MkdirTemp("", "pdserve-deploy-")
	if err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	p := &procs{dir: dir}
	defer func() {
		if err != nil {
			p.close(context.Background())
		}
	}()
	write := func(name, v string) (string, error) {
		f := filepath.Join(dir, name)
		return f, os.WriteFile(f, []byte(v), 0o600)
	}
	coordTok, prefillTok := secret(), secret()
	coordFile, err := write("coordinator.token", coordTok)
	if err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	prefillFile, err := write("prefill.token", prefillTok)
	if err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	counts := map[control.Role]int{}
	type worker struct {
		id   string
		role control.Role
		user control.NATSUser
		pw   string
	}
	var ws []worker
	for _, r := range roles {
		id := fmt.Sprintf("%s-%d", r, counts[r])
		counts[r]++
		u := control.NewNATSUser(r, id)
		pw, err := write(id+".nats-password", u.Password)
		if err != nil {
			return nil, fmt.Errorf("deploy: %w", err)
		}
		ws = append(ws, worker{id: id, role: r, user: u, pw: pw})
		o.NATSUsers = append(o.NATSUsers, u)
	}
	o.GRPCAuth = grpcauth.Options{Token: coordTok}
	o.BeforeNATSDrain = p.stopWorkers
	if p.Coordinator, err = coordinator.Start(ctx, o, log); err != nil {
		return nil, fmt.Errorf("deploy: start %s: %w", s.Mode, err)
	}
	for i, w := range ws {
		args := []string{"--id", w.id, "--grpc-addr", "127.0.0.1:0", "--metrics-addr=",
			"--nats-url", p.NATSURL(), "--nats-user", w.user.User, "--nats-password-file", w.pw,
			"--grpc-token-file", coordFile, "--grpc-prefill-token-file", prefillFile,
			"--heartbeat-interval", "200ms", "--log-level", "warn"}
		args = append(args, s.engineArgs(len(cpus[i]))...)
		args = append(args, s.stepArgs(w.role)...)
		cmd := exec.Command(self, args...)
		cmd.Env = append(os.Environ(), childEnv+"="+string(w.role))
		logPath := filepath.Join(dir, w.id+".log")
		f, err := os.Create(logPath)
		if err != nil {
			return nil, fmt.Errorf("deploy: %w", err)
		}
		cmd.Stdout, cmd.Stderr = f, f
		err = startPinned(cmd, cpus[i])
		f.Close() // the child holds its own descriptor
		if err != nil {
			return nil, fmt.Errorf("deploy: start worker %s: %w", w.id, err)
		}
		pr := &proc{Process: Process{ID: w.id, Role: w.role, PID: cmd.Process.Pid, CPUs: cpus[i]}, cmd: cmd, log: logPath, done: make(chan struct{})}
		go func() {
			pr.err = cmd.Wait()
			close(pr.done)
		}()
		p.procs = append(p.procs, pr)
	}
	return p, nil
}

// exited returns an error naming a worker process that has ended, with
// the tail of its log; nil while all run.
func (p *procs) exited() error {
	for _, pr := range p.procs {
		select {
		case <-pr.done:
			return fmt.Errorf("deploy: worker %s exited (%v): %s", pr.ID, pr.err, tail(pr.log, 800))
		default:
		}
	}
	return nil
}

// tail returns the last n bytes of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// stopWorkers sends SIGTERM to every worker process and waits for it (a
// graceful stop: its requests drain), killing one that is still there
// after the context ends or 20 s. Once; later calls return the first
// result.
func (p *procs) stopWorkers(ctx context.Context) error {
	p.stopOnce.Do(func() {
		for _, pr := range p.procs {
			_ = pr.cmd.Process.Signal(syscall.SIGTERM)
		}
		t := time.NewTimer(20 * time.Second)
		defer t.Stop()
		var errs []error
		for _, pr := range p.procs {
			select {
			case <-pr.done:
			case <-ctx.Done():
				_ = pr.cmd.Process.Kill()
				<-pr.done
				errs = append(errs, fmt.Errorf("deploy: worker %s killed: %w", pr.ID, ctx.Err()))
			case <-t.C:
				_ = pr.cmd.Process.Kill()
				<-pr.done
				errs = append(errs, fmt.Errorf("deploy: worker %s did not stop within 20 s; killed", pr.ID))
			}
			var ee *exec.ExitError
			if pr.err != nil && !errors.As(pr.err, &ee) {
				errs = append(errs, fmt.Errorf("deploy: worker %s: %w", pr.ID, pr.err))
			} else if ee != nil && ee.ExitCode() != 0 && !strings.Contains(ee.String(), "killed") {
				errs = append(errs, fmt.Errorf("deploy: worker %s: %v: %s", pr.ID, ee, tail(pr.log, 400)))
			}
		}
		p.stopErr = errors.Join(errs...)
	})
	return p.stopErr
}

// close stops everything started: the coordinator (which stops the
// workers before its NATS drain), the workers when no coordinator runs,
// and removes the secrets' directory.
func (p *procs) close(ctx context.Context) error {
	var errs []error
	if p.Coordinator != nil {
		errs = append(errs, p.Coordinator.Shutdown(ctx))
	}
	errs = append(errs, p.stopWorkers(ctx))
	errs = append(errs, os.RemoveAll(p.dir))
	return errors.Join(errs...)
}

// Shutdown stops the deployment gracefully, bounded by ctx.
func (p *procs) Shutdown(ctx context.Context) error { return p.close(ctx) }

// Ready reports the coordinator's readiness, or a worker that exited.
func (p *procs) Ready() error {
	if err := p.exited(); err != nil {
		return err
	}
	return p.Coordinator.Ready()
}

// processes returns the worker processes.
func (p *procs) processes() []Process {
	out := make([]Process, len(p.procs))
	for i, pr := range p.procs {
		out[i] = pr.Process
	}
	return out
}
