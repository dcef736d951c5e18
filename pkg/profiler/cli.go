package profiler

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// Options are the flags of `coordinator profile`.
type Options struct {
	Engine       enginecfg.Options
	Out          string
	Budget       time.Duration
	Repeats      int
	MaxTokens    int
	MaxBatch     int
	KVTokens     int64
	Tolerance    float64
	HardwareName string
	ModelName    string
	Seed         uint64
	// Refit, when set, names a measured profile whose points are fitted
	// again (Refit) instead of measuring an engine.
	Refit string
}

// DefaultOptions returns the flag defaults: the llamacpp engine, a
// two-minute budget, 3 repeats, prompts and contexts up to 2048 tokens,
// decode batches up to 32.
func DefaultOptions() Options {
	e := enginecfg.DefaultOptions()
	e.Engine = enginecfg.Llama
	return Options{Engine: e, Budget: 2 * time.Minute, Repeats: 3, MaxTokens: 2048, MaxBatch: 32, Tolerance: 0.25, Seed: 1}
}

// AddFlags registers the options on fs: the engine's flags (package
// enginecfg) and the profiler's own.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	o.Engine.AddFlags(fs)
	fs.StringVar(&o.Out, "out", o.Out, "write the profile JSON to this file (required); plan --profile FILE, --engine sim --profile FILE and --planner-profile FILE read it")
	fs.DurationVar(&o.Budget, "budget", o.Budget, "wall time the measurement may take; the grid of prompt lengths, batches and contexts shrinks to fit")
	fs.IntVar(&o.Repeats, "repeats", o.Repeats, "timed repetitions per point (the point is their median)")
	fs.IntVar(&o.MaxTokens, "max-tokens", o.MaxTokens, "longest prompt and decode context measured (capped by the engine's context)")
	fs.IntVar(&o.MaxBatch, "max-batch", o.MaxBatch, "largest decode batch measured (capped by --max-seqs)")
	fs.Int64Var(&o.KVTokens, "kv-tokens", o.KVTokens, "one worker's KV pool the profile states, tokens (0: the engine's: llama.cpp's --ctx-size cells; the ref engine has none and needs it)")
	fs.Float64Var(&o.Tolerance, "tolerance", o.Tolerance, "largest |rel_err| a point should have; points beyond it are reported (the profile's tolerance)")
	fs.StringVar(&o.HardwareName, "hardware-name", o.HardwareName, "hardware part of the profile's name (default cpu, or the GPU's name)")
	fs.StringVar(&o.ModelName, "model-name", o.ModelName, "model part of the profile's name (default the model's own name)")
	fs.Uint64Var(&o.Seed, "token-seed", o.Seed, "seed of the random prompt tokens")
	fs.StringVar(&o.Refit, "refit", o.Refit, "fit the measured points of this profile file again with this version's fit and write the result to --out; no engine runs")
}

// errUsage marks option errors (exit code 2).
var errUsage = errors.New("usage")

// Validate reports every invalid option in one error.
func (o Options) Validate() error {
	var errs []error
	if o.Out == "" {
		errs = append(errs, errors.New("--out FILE is required"))
	}
	if o.Refit != "" {
		if len(errs) > 0 {
			return fmt.Errorf("%w: %w", errUsage, errors.Join(errs...))
		}
		return nil
	}
	if o.Budget <= 0 {
		errs = append(errs, fmt.Errorf("--budget %v must be > 0", o.Budget))
	}
	if o.Repeats < 1 {
		errs = append(errs, fmt.Errorf("--repeats %d must be ≥ 1", o.Repeats))
	}
	if o.MaxTokens < 32 || o.MaxBatch < 2 {
		errs = append(errs, fmt.Errorf("--max-tokens %d must be ≥ 32 and --max-batch %d ≥ 2", o.MaxTokens, o.MaxBatch))
	}
	if o.KVTokens < 0 {
		errs = append(errs, fmt.Errorf("--kv-tokens %d must be ≥ 0", o.KVTokens))
	}
	if o.Engine.Engine == enginecfg.Ref && o.KVTokens == 0 {
		errs = append(errs, errors.New("--engine ref has no KV cache of its own: give --kv-tokens"))
	}
	if !(o.Tolerance > 0) || math.IsInf(o.Tolerance, 0) {
		errs = append(errs, fmt.Errorf("--tolerance %v must be > 0", o.Tolerance))
	}
	if strings.Contains(o.HardwareName+o.ModelName, "/") {
		errs = append(errs, errors.New("--hardware-name and --model-name must not contain '/'"))
	}
	if err := o.Engine.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", errUsage, errors.Join(errs...))
	}
	return nil
}

// Main is `coordinator profile ARGS`. It builds the engine, measures it
// within --budget, fits the profile and writes it to --out, and prints
// every point's measured and fitted time to stdout; progress goes to
// stderr (a bar on a terminal, a line per level otherwise). Exit codes: 0
// written; 1 the engine, the fit or the write failed, or ctx was
// cancelled; 2 bad flags.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := DefaultOptions()
	fs := flag.NewFlagSet("coordinator profile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.AddFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: coordinator profile --engine llamacpp --model X.gguf --out FILE.json [flags]\n\n"+
			"Runs one engine alone and measures the step times the performance model needs: prefill time\n"+
			"against the prompt tokens of a batch, decode step time against batch size and context,\n"+
			"mixed steps, and the KV bytes per token. It fits the DistServe form of package perfmodel\n"+
			"(least squares on relative error) and writes a profile with the points, the coefficients,\n"+
			"each point's rel_err, the total error and the hardware, which plan --profile, the sim\n"+
			"engine and the online planner read. A CPU profile counts threads (--engine-threads) where\n"+
			"a GPU profile counts GPUs: pin the process (taskset) to as many cores.\n\n"+
			"Examples:\n"+
			"  taskset -c 0 coordinator profile --model qwen2.5-0.5b-q8_0.gguf --engine-threads 1 --ctx-size 8192 --out cpu-t1.json\n"+
			"  coordinator plan --profile cpu-t1.json --gpu-budget 2 --workload fixed:256/64 --slo-ttft 2s --slo-tpot 200ms\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := cliflags.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(stderr, "coordinator profile: %v\n", strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
		return 2
	}
	var p *perfmodel.Profile
	var err error
	if o.Refit != "" {
		if p, err = perfmodel.LoadFile(o.Refit); err == nil {
			err = Refit(p)
		}
	} else {
		p, err = Profile(ctx, o, stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "coordinator profile: %v\n", err)
		return 1
	}
	if err := p.WriteFile(o.Out); err != nil {
		fmt.Fprintf(stderr, "coordinator profile: %v\n", err)
		return 1
	}
	if err := WriteReport(stdout, p); err != nil {
		fmt.Fprintf(stderr, "coordinator profile: %v\n", err)
		return 1
	}
	if o.Refit != "" {
		fmt.Fprintf(stderr, "coordinator profile: wrote %s (%s), refitted from %s\n", o.Out, p.Name, o.Refit)
		return 0
	}
	fmt.Fprintf(stderr, "coordinator profile: wrote %s (%s) in %.1f s\n", o.Out, p.Name, p.Measured.ElapsedS)
	return 0
}

// Refit fits a measured profile's points again with perfmodel.FitDistServe
// and sets the coefficients, every point's rel_err and the fit summary, so
// that a profile measured by an earlier version gains the terms of this
// one without measuring again. Errors: a profile that was not measured
// (no Measured), perfmodel.ErrFit, perfmodel.ErrInvalidProfile.
func Refit(p *perfmodel.Profile) error {
	if p.Measured == nil || p.Form != perfmodel.FormDistServe {
		return fmt.Errorf("profiler: refit: %s is not a measured profile (written by coordinator profile)", p.Name)
	}
	ds, err := perfmodel.FitDistServe(p.Points)
	if err != nil {
		return fmt.Errorf("profiler: refit: %w", err)
	}
	old := p.Measured.Fit.Method
	p.DistServe = ds
	p.Measured.Fit = p.SetFitErrors()
	p.Measured.Fit.Method = perfmodel.FitMethod
	if old != "" {
		p.Calibration = strings.Replace(p.Calibration, old, perfmodel.FitMethod, 1)
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("profiler: refit: %w", err)
	}
	return nil
}

// Profile builds the engine o names, measures it and returns the fitted
// profile; progress goes to progress (nil: none).
func Profile(ctx context.Context, o Options, progress io.Writer) (*perfmodel.Profile, error) {
	e, err := enginebuild.Build(o.Engine)
	if err != nil {
		return nil, err
	}
	defer enginebuild.Close(e)
	threads := o.Engine.Threads
	if threads == 0 {
		threads = runtime.NumCPU()
	}
	d := Describe{Engine: o.Engine.Engine, HardwareName: o.HardwareName, ModelName: o.ModelName,
		Host: HostInfo(threads), KVTokens: o.KVTokens, Budget: o.Budget.Seconds(), Tolerance: o.Tolerance}
	switch o.Engine.Engine {
	case enginecfg.Llama:
		d.EngineModel = filepath.Base(o.Engine.Model)
		if o.Engine.GPULayers != 0 {
			d.Host.GPU = cudaGPU(llamacpp.LibDir(o.Engine.LlamaLib))
		}
	case enginecfg.Ref:
		d.EngineModel = "preset " + o.Engine.Preset
	case enginecfg.Sim:
		d.EngineModel = o.Engine.Profile
		d.TimeScale = o.Engine.TimeScale
		if se, ok := e.(*sim.Engine); ok {
			d.Sim = se.Profile()
		}
	}
	if c, ok := e.(Capacity); ok && d.KVTokens == 0 {
		tokens, _ := c.KVCapacity()
		d.KVTokens = int64(tokens)
	}
	bar := newProgressWriter(progress)
	res, err := Measure(ctx, e, Settings{
		Budget: o.Budget, Repeats: o.Repeats, MaxTokens: o.MaxTokens, MaxBatch: o.MaxBatch, Seed: o.Seed,
		Progress: bar.update,
	})
	bar.finish()
	if err != nil {
		return nil, err
	}
	return Build(res, e.Spec(), d)
}

// WriteReport prints the profile's points (measured, model, rel_err),
// coefficients and total error.
func WriteReport(w io.Writer, p *perfmodel.Profile) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "profile %s: %s\n", p.Name, p.Source)
	if m := p.Measured; m != nil {
		fmt.Fprintf(tw, "hardware: %s, %d logical CPUs, %d threads", cpuName(m.Hardware.CPU), m.Hardware.LogicalCPUs, m.Hardware.Threads)
		if m.Hardware.GPU != "" {
			fmt.Fprintf(tw, ", GPU %s", m.Hardware.GPU)
		}
		fmt.Fprintf(tw, "\ngrid: %s\n\n", m.Grid)
	}
	fmt.Fprintln(tw, "POINT\tSAMPLES\tSPREAD\tMEASURED ms\tMODEL ms\tREL.ERR\t")
	for _, pt := range p.Points {
		if pt.RelErr == nil {
			continue
		}
		model := p.StepSeconds(pt.Batch()) * 1e3
		flag := ""
		if math.Abs(*pt.RelErr) > p.Tolerance {
			flag = fmt.Sprintf("beyond ±%.0f%%", 100*p.Tolerance)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%.4g\t%.4g\t%+.1f%%\t%s\n", pt.Name, pt.Samples, 100*pt.Spread, pt.Value, model, 100**pt.RelErr, flag)
	}
	d := p.DistServe
	fmt.Fprintf(tw, "\nprefill ms = %.4g + %.4g·Σl + %.4g·Σl² + %.4g·X (X: each prompt token × the other prompts' cells)\n",
		d.Prefill[0], d.Prefill[1], d.Prefill[2], d.PrefillCross)
	if t := d.LargeBatchThreshold; t > 1 {
		fmt.Fprintf(tw, "decode ms  = %.4g + %.4g·Σn + %.4g·B for B < %d; %.4g + %.4g·Σn + %.4g·B for B ≥ %d\n",
			d.DecodeSmall[0], d.DecodeSmall[1], d.DecodeSmall[2], t, d.DecodeLarge[0], d.DecodeLarge[1], d.DecodeLarge[2], t)
	} else {
		fmt.Fprintf(tw, "decode ms  = %.4g + %.4g·Σn + %.4g·B\n", d.DecodeLarge[0], d.DecodeLarge[1], d.DecodeLarge[2])
	}
	fmt.Fprintf(tw, "mixed ms   = max(a_p, a_d) + the parts' marginal costs + %.4g + %.4g·Σn + %.4g·Σl·Σn\n", d.Mixed[0], d.Mixed[1], d.Mixed[2])
	fmt.Fprintf(tw, "KV bytes per token: %d; KV pool: %d tokens per worker\n", p.KVBytesPerToken(), p.MaxKVTokens())
	if m := p.Measured; m != nil {
		f := m.Fit
		fmt.Fprintf(tw, "fit error over %d points: total %.1f%% (Σ|model−measured| / Σ measured), rms %.1f%%, max %.1f%%\n",
			f.Points, 100*f.TotalRelErr, 100*f.RMSRelErr, 100*f.MaxRelErr)
	}
	return tw.Flush()
}

// progressWriter draws a bar on a terminal and writes a plain line per
// grid level otherwise.
type progressWriter struct {
	w     io.Writer
	tty   bool
	level int
	last  Progress
	drawn bool
}

func newProgressWriter(w io.Writer) *progressWriter {
	return &progressWriter{w: w, tty: isTerminal(w), level: -1}
}

// isTerminal reports whether w is a character device (a TTY).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (p *progressWriter) update(pr Progress) {
	if p.w == nil {
		return
	}
	p.last = pr
	if p.tty {
		const width = 30
		frac := min(pr.Elapsed.Seconds()/pr.Budget.Seconds(), 1)
		fill := int(frac * width)
		fmt.Fprintf(p.w, "\r[%s%s] %5.1f/%.0f s  level %d  %d/%d points  %-24s",
			strings.Repeat("=", fill), strings.Repeat(" ", width-fill), pr.Elapsed.Seconds(), pr.Budget.Seconds(),
			pr.Level, pr.Done, pr.Planned, pr.LastPoint)
		p.drawn = true
		return
	}
	if pr.Level != p.level {
		p.level = pr.Level
		fmt.Fprintf(p.w, "coordinator profile: level %d (%d points planned so far), %.1f s of %v\n", pr.Level, pr.Planned, pr.Elapsed.Seconds(), pr.Budget)
	}
}

func (p *progressWriter) finish() {
	if p.w == nil {
		return
	}
	if p.drawn {
		fmt.Fprintln(p.w)
	}
	if !p.tty && p.last.Done > 0 {
		fmt.Fprintf(p.w, "coordinator profile: %d points in %.1f s\n", p.last.Done, p.last.Elapsed.Seconds())
	}
}
