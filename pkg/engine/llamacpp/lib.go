package llamacpp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"go.uber.org/zap"
)

// EnvLib names the environment variable that gives the default directory
// of llama.cpp's shared libraries.
const EnvLib = "PDSERVE_LLAMA_LIB"

// DefaultLibDir is where `make llama` installs the libraries, relative to
// the working directory.
const DefaultLibDir = "third_party/llama/lib"

// ErrNoLibrary is returned when llama.cpp's shared libraries cannot be
// found or loaded.
var ErrNoLibrary = errors.New("llamacpp: llama.cpp libraries not found")

// LibDir returns dir, or $PDSERVE_LLAMA_LIB when dir is empty, or
// DefaultLibDir when both are empty.
func LibDir(dir string) string {
	if dir != "" {
		return dir
	}
	if d := os.Getenv(EnvLib); d != "" {
		return d
	}
	return DefaultLibDir
}

// The C structs mirror include/llama.h of the pinned release field for field
// (offsets checked with offsetof against that header: model params 80
// bytes, context params 160, batch 56).
type modelParams struct {
	devices             uintptr
	tensorBuftOverrides uintptr
	nGPULayers          int32
	splitMode           int32
	loadMode            int32
	lazyMode            int32
	mainGPU             int32
	_                   int32
	tensorSplit         uintptr
	progressCallback    uintptr
	progressUserData    uintptr
	kvOverrides         uintptr
	vocabOnly           bool
	checkTensors        bool
	useExtraBufts       bool
	noHost              bool
	noAlloc             bool
	loadMTP             bool
	_                   [2]byte
}

type contextParams struct {
	nCtx              uint32
	nBatch            uint32
	nUBatch           uint32
	nSeqMax           uint32
	nRSSeq            uint32
	nOutputsMax       uint32
	nOutputsMaxPerSeq uint32
	nThreads          int32
	nThreadsBatch     int32
	ctxType           int32
	ropeScalingType   int32
	poolingType       int32
	attentionType     int32
	flashAttnType     int32
	ropeFreqBase      float32
	ropeFreqScale     float32
	yarnExtFactor     float32
	yarnAttnFactor    float32
	yarnBetaFast      float32
	yarnBetaSlow      float32
	yarnOrigCtx       uint32
	defragThold       float32
	cbEval            uintptr
	cbEvalUserData    uintptr
	typeK             int32
	typeV             int32
	abortCallback     uintptr
	abortCallbackData uintptr
	embeddings        bool
	offloadKQV        bool
	noPerf            bool
	opOffload         bool
	swaFull           bool
	kvUnified         bool
	_                 [2]byte
	samplers          uintptr
	nSamplers         uintptr
	ctxOther          uintptr
}

// batch is struct llama_batch. Its arrays are Go memory owned by the
// engine (see batchBuf): Go's heap does not move, and the engine keeps
// them alive across every call that reads them.
type batch struct {
	nTokens int32
	_       int32
	token   uintptr // *llama_token
	embd    uintptr // *float
	pos     uintptr // *llama_pos
	nSeqID  uintptr // *int32
	seqID   uintptr // **llama_seq_id
	logits  uintptr // *int8
}

type chatMessage struct {
	role, content uintptr // const char *
}

// ggml types used for the KV cache.
const (
	ggmlTypeF16  = 1
	ggmlTypeQ8_0 = 8
)

const flashAttnEnabled = 1

// api holds llama.cpp's entry points. All are set by load.
type api struct {
	version              func() *byte
	systemInfo           func() *byte
	backendInit          func()
	backendLoadAllFrom   func(dir string)
	backendLoad          func(path string) uintptr
	devCount             func() uintptr
	devGet               func(i uintptr) uintptr
	devType              func(dev uintptr) int32
	devName              func(dev uintptr) *byte
	devDescription       func(dev uintptr) *byte
	logSet               func(cb uintptr, ud uintptr)
	modelDefaultParams   func() modelParams
	contextDefaultParams func() contextParams
	modelLoadFromFile    func(path string, p modelParams) uintptr
	modelFree            func(m uintptr)
	initFromModel        func(m uintptr, p contextParams) uintptr
	free                 func(ctx uintptr)
	modelGetVocab        func(m uintptr) uintptr
	modelNCtxTrain       func(m uintptr) int32
	modelNEmbd           func(m uintptr) int32
	modelNLayer          func(m uintptr) int32
	modelNHead           func(m uintptr) int32
	modelNHeadKV         func(m uintptr) int32
	modelNParams         func(m uintptr) uint64
	modelMetaValStr      func(m uintptr, key string, buf []byte, n uintptr) int32
	modelChatTemplate    func(m uintptr, name *byte) *byte
	nCtx                 func(ctx uintptr) uint32
	nBatch               func(ctx uintptr) uint32
	getMemory            func(ctx uintptr) uintptr
	memorySeqRm          func(mem uintptr, seq, p0, p1 int32) bool
	memorySeqCp          func(mem uintptr, src, dst, p0, p1 int32)
	memorySeqPosMax      func(mem uintptr, seq int32) int32
	memorySeqPosMin      func(mem uintptr, seq int32) int32
	decode               func(ctx uintptr, b batch) int32
	getLogitsIth         func(ctx uintptr, i int32) *float32
	stateSeqGetSize      func(ctx uintptr, seq int32) uintptr
	stateSeqGetData      func(ctx uintptr, dst []byte, size uintptr, seq int32) uintptr
	stateSeqSetData      func(ctx uintptr, src []byte, size uintptr, seq int32) uintptr
	vocabNTokens         func(v uintptr) int32
	vocabBOS             func(v uintptr) int32
	vocabEOS             func(v uintptr) int32
	vocabIsEOG           func(v uintptr, tok int32) bool
	vocabGetAddBOS       func(v uintptr) bool
	tokenize             func(v uintptr, text []byte, textLen int32, tokens []int32, nMax int32, addSpecial, parseSpecial bool) int32
	tokenToPiece         func(v uintptr, tok int32, buf []byte, length int32, lstrip int32, special bool) int32
	chatApplyTemplate    func(tmpl *byte, chat []chatMessage, n uintptr, addAss bool, buf []byte, length int32) int32
	batchGetOne          func(tokens []int32, n int32) batch
	samplerInitGreedy    func() uintptr
	samplerSample        func(smpl, ctx uintptr, idx int32) int32
	samplerFree          func(smpl uintptr)
	samplerInitGrammar   func(vocab uintptr, gbnf, root string) uintptr
	samplerApply         func(smpl uintptr, cur *tokenDataArray)
	samplerAccept        func(smpl uintptr, tok int32)
}

var (
	loadMu   sync.Mutex
	loaded   = map[string]*api{} // by absolute library directory
	logger   = zap.NewNop()
	logMu    sync.Mutex
	logCB    uintptr
	loadedAt string // the directory whose libraries this process uses
	// loadedVariant is the CPU backend variant this process uses ("" when
	// the directory has none, e.g. a build with the CPU backend linked in).
	loadedVariant string
)

// libNames returns the file in dir whose name starts with prefix and looks
// like a shared library ("libllama.so", "libllama.v0.4.0.so",
// "libllama.so.0"), preferring the shortest name.
func findLib(dir, prefix string) (string, bool) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", false
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		rest, ok := strings.CutPrefix(n, prefix)
		if !ok || !strings.Contains(n, ".so") {
			continue
		}
		// libggml must not match libggml-base or libggml-cpu-*.
		if rest != "" && rest[0] != '.' {
			continue
		}
		names = append(names, n)
	}
	if len(names) == 0 {
		return "", false
	}
	sort.Slice(names, func(i, j int) bool { return len(names[i]) < len(names[j]) })
	return filepath.Join(dir, names[0]), true
}

// load opens the llama.cpp libraries in dir once per process and returns
// their entry points, with the CPU backend variant named by variant ("":
// the one llama.cpp scores best for this processor; see CPUVariants), and
// every other backend library of dir (CUDA, …) unless noGPU, on the first
// call only: a later call's noGPU changes nothing (a model is kept off the
// GPUs by its device list, see LoadModel). A process uses one llama.cpp:
// loading a second, different directory or variant is an error.
func load(dir, variant string, noGPU bool) (*api, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("llamacpp: library dir %q: %w", dir, err)
	}
	loadMu.Lock()
	defer loadMu.Unlock()
	if a, ok := loaded[abs]; ok {
		if variant != "" && variant != loadedVariant {
			return nil, fmt.Errorf("llamacpp: this process already uses the CPU backend %q; cannot also load %q", loadedVariant, variant)
		}
		return a, nil
	}
	var chosen string
	if variant != "" {
		vs, err := CPUVariants(abs)
		if err != nil {
			return nil, err
		}
		if chosen, err = pickVariant(vs, variant); err != nil {
			return nil, err
		}
	}
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		return nil, fmt.Errorf("%w: loading llama.cpp is supported on linux and darwin, not %s", ErrNoLibrary, runtime.GOOS)
	}
	ggmlPath, okG := findLib(abs, "libggml")
	llamaPath, okL := findLib(abs, "libllama")
	if !okG || !okL {
		var missing []string
		if !okL {
			missing = append(missing, "libllama*.so")
		}
		if !okG {
			missing = append(missing, "libggml*.so")
		}
		return nil, fmt.Errorf("%w: %s missing in %s; run `make llama` (installs the pinned prebuilt CPU build into %s), or point --llama-lib (or $%s) at the directory of your own llama.cpp build (build/bin)",
			ErrNoLibrary, strings.Join(missing, " and "), abs, DefaultLibDir, EnvLib)
	}
	if loadedAt != "" {
		return nil, fmt.Errorf("llamacpp: this process already uses llama.cpp from %s; cannot also load %s", loadedAt, abs)
	}
	// libggml first, global, so that libllama and the backends it loads
	// resolve against it.
	hg, err := purego.Dlopen(ggmlPath, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %v", ErrNoLibrary, ggmlPath, err)
	}
	hl, err := purego.Dlopen(llamaPath, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %v", ErrNoLibrary, llamaPath, err)
	}
	a := new(api)
	if err := a.register(hg, hl); err != nil {
		return nil, err
	}
	logMu.Lock()
	if logCB == 0 {
		logCB = purego.NewCallback(logFromC)
	}
	logMu.Unlock()
	a.logSet(logCB, 0)
	if chosen == "" && !noGPU {
		a.backendLoadAllFrom(abs)
		// llama.cpp loaded the best-scoring variant; name it.
		if vs, err := CPUVariants(abs); err == nil && len(vs) > 0 && vs[0].Score > 0 {
			chosen = vs[0].Name
		}
	} else {
		if chosen == "" { // no GPU backends: pick the CPU variant as llama.cpp would
			vs, err := CPUVariants(abs)
			if err != nil {
				return nil, err
			}
			if len(vs) > 0 {
				if vs[0].Score <= 0 {
					return nil, fmt.Errorf("%w: no CPU backend of %s runs on this processor", ErrNoLibrary, abs)
				}
				chosen = vs[0].Name
			}
		}
		if err := a.loadBackends(abs, chosen, noGPU); err != nil {
			return nil, err
		}
	}
	a.backendInit()
	loaded[abs] = a
	loadedAt = abs
	loadedVariant = chosen
	logger.Debug("llamacpp: loaded", zap.String("dir", abs), zap.String("version", goString(a.version())),
		zap.String("cpu_variant", chosen), zap.Bool("gpu_backends", !noGPU), zap.Stringers("devices", a.devices()),
		zap.String("system", goString(a.systemInfo())))
	return a, nil
}

// loadBackends registers the CPU backend variant named cpu ("": the
// unsuffixed libggml-cpu.so, if dir has one) and, unless noGPU, every
// non-CPU backend library in dir (CUDA, HIP, Vulkan, …), in place of
// ggml_backend_load_all_from_path's choice.
func (a *api) loadBackends(dir, cpu string, noGPU bool) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoLibrary, err)
	}
	for _, e := range ents {
		n := e.Name()
		rest, ok := strings.CutPrefix(n, "libggml-")
		if noGPU || !ok || !strings.HasSuffix(n, ".so") || strings.HasPrefix(rest, "base") || strings.HasPrefix(rest, "cpu") {
			continue
		}
		a.backendLoad(filepath.Join(dir, n)) // a backend this machine cannot run declines (logged by llama.cpp)
	}
	if cpu == "" {
		// A build without variants: its one CPU backend library, or none
		// (linked into libggml).
		if p := filepath.Join(dir, "libggml-cpu.so"); fileExists(p) && a.backendLoad(p) == 0 {
			return fmt.Errorf("%w: llama.cpp refused the CPU backend %s", ErrNoLibrary, p)
		}
		return nil
	}
	p := filepath.Join(dir, variantPrefix+cpu+".so")
	if a.backendLoad(p) == 0 {
		return fmt.Errorf("%w: llama.cpp refused the CPU backend %s", ErrNoLibrary, p)
	}
	return nil
}

const variantPrefix = "libggml-cpu-"

// Variant is one CPU backend library of a llama.cpp build with dynamic
// backends: its name (libggml-cpu-NAME.so) and the score llama.cpp gives
// it on this processor (0: it needs instructions this processor lacks;
// higher is more specific). llama.cpp's default loads the best one.
type Variant struct {
	Name  string
	Score int
}

// CPUVariants lists the CPU backend variants in dir, best first (ties by
// name). Each is opened to ask its score, as llama.cpp does when it picks
// one; nothing is registered. A directory without variant libraries (a
// build with the CPU backend linked in) gives none and no error.
func CPUVariants(dir string) ([]Variant, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoLibrary, err)
	}
	var vs []Variant
	for _, e := range ents {
		name, ok := strings.CutPrefix(e.Name(), variantPrefix)
		if !ok || !strings.HasSuffix(name, ".so") {
			continue
		}
		name = strings.TrimSuffix(name, ".so")
		h, err := purego.Dlopen(filepath.Join(dir, e.Name()), purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			return nil, fmt.Errorf("%w: open %s: %v", ErrNoLibrary, e.Name(), err)
		}
		score := 1 // a variant without a score function runs anywhere
		if sym, err := purego.Dlsym(h, "ggml_backend_score"); err == nil {
			r, _, _ := purego.SyscallN(sym)
			score = int(int32(r))
		}
		vs = append(vs, Variant{Name: name, Score: score})
	}
	sort.Slice(vs, func(i, j int) bool {
		if vs[i].Score != vs[j].Score {
			return vs[i].Score > vs[j].Score
		}
		return vs[i].Name < vs[j].Name
	})
	return vs, nil
}

// pickVariant returns name when vs has it and this processor can run it.
func pickVariant(vs []Variant, name string) (string, error) {
	for _, v := range vs {
		if v.Name != name {
			continue
		}
		if v.Score <= 0 {
			return "", fmt.Errorf("%w: CPU backend %q needs instructions this processor lacks (it can run: %s)", ErrNoLibrary, name, strings.Join(runnable(vs), ", "))
		}
		return name, nil
	}
	return "", fmt.Errorf("%w: no CPU backend %q in this llama.cpp build (this processor can run: %s)", ErrNoLibrary, name, strings.Join(runnable(vs), ", "))
}

// runnable names the variants of vs this processor can run, best first.
func runnable(vs []Variant) []string {
	var names []string
	for _, v := range vs {
		if v.Score > 0 {
			names = append(names, v.Name)
		}
	}
	return names
}

// LoadedCPUVariant returns the CPU backend variant this process loaded ("":
// none loaded yet, or a build without variant libraries).
func LoadedCPUVariant() string {
	loadMu.Lock()
	defer loadMu.Unlock()
	return loadedVariant
}

// register binds every entry point, with an error naming a missing symbol
// (a llama.cpp of another release).
func (a *api) register(ggml, llama uintptr) (err error) {
	bind := func(fptr any, h uintptr, name string) {
		if err != nil {
			return
		}
		sym, e := purego.Dlsym(h, name)
		if e != nil {
			err = fmt.Errorf("%w: symbol %s missing (llama.cpp of another release? pdserve needs the one `make llama` installs): %v", ErrNoLibrary, name, e)
			return
		}
		purego.RegisterFunc(fptr, sym)
	}
	bind(&a.backendLoadAllFrom, ggml, "ggml_backend_load_all_from_path")
	bind(&a.backendLoad, ggml, "ggml_backend_load")
	bind(&a.devCount, ggml, "ggml_backend_dev_count")
	bind(&a.devGet, ggml, "ggml_backend_dev_get")
	bind(&a.devType, ggml, "ggml_backend_dev_type")
	bind(&a.devName, ggml, "ggml_backend_dev_name")
	bind(&a.devDescription, ggml, "ggml_backend_dev_description")
	for _, f := range []struct {
		fptr any
		name string
	}{
		{&a.version, "llama_version"},
		{&a.systemInfo, "llama_print_system_info"},
		{&a.backendInit, "llama_backend_init"},
		{&a.logSet, "llama_log_set"},
		{&a.modelDefaultParams, "llama_model_default_params"},
		{&a.contextDefaultParams, "llama_context_default_params"},
		{&a.modelLoadFromFile, "llama_model_load_from_file"},
		{&a.modelFree, "llama_model_free"},
		{&a.initFromModel, "llama_init_from_model"},
		{&a.free, "llama_free"},
		{&a.modelGetVocab, "llama_model_get_vocab"},
		{&a.modelNCtxTrain, "llama_model_n_ctx_train"},
		{&a.modelNEmbd, "llama_model_n_embd"},
		{&a.modelNLayer, "llama_model_n_layer"},
		{&a.modelNHead, "llama_model_n_head"},
		{&a.modelNHeadKV, "llama_model_n_head_kv"},
		{&a.modelNParams, "llama_model_n_params"},
		{&a.modelMetaValStr, "llama_model_meta_val_str"},
		{&a.modelChatTemplate, "llama_model_chat_template"},
		{&a.nCtx, "llama_n_ctx"},
		{&a.nBatch, "llama_n_batch"},
		{&a.getMemory, "llama_get_memory"},
		{&a.memorySeqRm, "llama_memory_seq_rm"},
		{&a.memorySeqCp, "llama_memory_seq_cp"},
		{&a.memorySeqPosMax, "llama_memory_seq_pos_max"},
		{&a.memorySeqPosMin, "llama_memory_seq_pos_min"},
		{&a.decode, "llama_decode"},
		{&a.getLogitsIth, "llama_get_logits_ith"},
		{&a.stateSeqGetSize, "llama_state_seq_get_size"},
		{&a.stateSeqGetData, "llama_state_seq_get_data"},
		{&a.stateSeqSetData, "llama_state_seq_set_data"},
		{&a.vocabNTokens, "llama_vocab_n_tokens"},
		{&a.vocabBOS, "llama_vocab_bos"},
		{&a.vocabEOS, "llama_vocab_eos"},
		{&a.vocabIsEOG, "llama_vocab_is_eog"},
		{&a.vocabGetAddBOS, "llama_vocab_get_add_bos"},
		{&a.tokenize, "llama_tokenize"},
		{&a.tokenToPiece, "llama_token_to_piece"},
		{&a.chatApplyTemplate, "llama_chat_apply_template"},
		{&a.batchGetOne, "llama_batch_get_one"},
		{&a.samplerInitGreedy, "llama_sampler_init_greedy"},
		{&a.samplerSample, "llama_sampler_sample"},
		{&a.samplerFree, "llama_sampler_free"},
		{&a.samplerInitGrammar, "llama_sampler_init_grammar"},
		{&a.samplerApply, "llama_sampler_apply"},
		{&a.samplerAccept, "llama_sampler_accept"},
	} {
		bind(f.fptr, llama, f.name)
	}
	return err
}

// SetLogger routes llama.cpp's log lines to l, named "llama.cpp": its
// errors (GGML_LOG_LEVEL_ERROR) at error level, everything else at debug
// level, warnings included. llama.cpp warns about what an operator can
// neither act on nor needs to, on every load of some models (the qwen2
// vocabulary's "control-looking token … was not control-type; this is
// probably a bug in the model"), and the engine returns an error of its
// own for every call that fails; --log-level debug shows the warnings. A
// continuation line (GGML_LOG_LEVEL_CONT) takes the level of the line it
// continues. The default discards every line.
func SetLogger(l *zap.Logger) {
	if l == nil {
		l = zap.NewNop()
	}
	logMu.Lock()
	logger = l.Named("llama.cpp")
	logMu.Unlock()
}

// ggml_log_level values (ggml.h).
const (
	logLevelError = 4
	logLevelCont  = 5 // continues the previous line
)

// logLast is the level of the last line that was not a continuation;
// guarded by logMu.
var logLast int32

func logFromC(level int32, text *byte, _ uintptr) {
	msg := strings.TrimRight(goString(text), "\n")
	if msg == "" {
		return
	}
	logMu.Lock()
	l := logger
	if level == logLevelCont {
		level = logLast
	} else {
		logLast = level
	}
	logMu.Unlock()
	if level == logLevelError {
		l.Error(msg)
	} else {
		l.Debug(msg)
	}
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
