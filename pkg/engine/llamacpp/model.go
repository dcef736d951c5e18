package llamacpp

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/pdserve/pdserve/pkg/engine"
)

// Model is a loaded GGUF model (or only its vocabulary). It is safe for
// concurrent use; Close it once every Engine built on it is closed.
type Model struct {
	api   *api
	ptr   uintptr // *llama_model
	vocab uintptr // *llama_vocab
	path  string
	name  string
	tok   *Tokenizer
	// gv is the vocabulary of grammars (grammar.go), built once.
	gvOnce sync.Once
	gv     *grammarVocab
}

// LoadOptions select how a model is loaded.
type LoadOptions struct {
	// LibDir is the directory of llama.cpp's shared libraries (see LibDir).
	LibDir string
	// GPULayers is the number of layers offloaded to GPUs; < 0 means all.
	// A CPU-only llama.cpp ignores it.
	GPULayers int
	// VocabOnly loads the tokenizer and chat template without weights.
	VocabOnly bool
	// NoRepack keeps weights in their file layout instead of repacking
	// them for llama.cpp's faster CPU kernels (llama-server's --no-repack).
	NoRepack bool
	// CPUVariant names the CPU backend library to load
	// (libggml-cpu-NAME.so: haswell, skylakex, sapphirerapids, zen4, …);
	// "" lets llama.cpp take the best one this processor can run. The
	// variants' kernels round differently, so workers on processors of
	// different families compute logits that differ slightly unless they
	// load the same variant. It is per process: every model of a process
	// uses the same one.
	CPUVariant string
	// Device is the device policy: DeviceAuto, DeviceGPU or DeviceCPU
	// ("": $PDSERVE_LLAMA_DEVICE, else DeviceAuto; see DeviceMode). With
	// DeviceGPU a model loaded with weights (not VocabOnly) needs a GPU
	// (ErrNoGPU otherwise); with DeviceCPU no GPU backend is loaded and
	// the model uses no GPU, whatever GPULayers says.
	Device string
}

// LoadModel loads the GGUF file at path. Errors: ErrNoLibrary, ErrNoGPU
// (see LoadOptions.Device), a missing or unreadable file, or a file
// llama.cpp refuses.
func LoadModel(path string, o LoadOptions) (*Model, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("llamacpp: model: %w", err)
	}
	mode, err := DeviceMode(o.Device)
	if err != nil {
		return nil, err
	}
	dir := LibDir(o.LibDir)
	a, err := load(dir, o.CPUVariant, mode == DeviceCPU)
	if err != nil {
		return nil, err
	}
	if mode == DeviceGPU && !o.VocabOnly {
		if err := a.requireGPU(dir); err != nil {
			return nil, err
		}
	}
	p := a.modelDefaultParams()
	p.nGPULayers = int32(o.GPULayers)
	if o.GPULayers < 0 {
		p.nGPULayers = -1
	}
	if mode == DeviceCPU {
		p.devices = noDevicesPtr()
		p.nGPULayers = 0
	}
	p.vocabOnly = o.VocabOnly
	if o.NoRepack {
		p.useExtraBufts = false
	}
	ptr := a.modelLoadFromFile(path, p)
	if ptr == 0 {
		return nil, fmt.Errorf("llamacpp: llama.cpp could not load model %s (not a GGUF file, an architecture this llama.cpp does not know, or not enough memory; run with --log-level debug for llama.cpp's reason)", path)
	}
	m := &Model{api: a, ptr: ptr, vocab: a.modelGetVocab(ptr), path: path}
	m.name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	m.tok = newTokenizer(m)
	return m, nil
}

// Close frees the model. It must not be used afterwards.
func (m *Model) Close() {
	if m.ptr != 0 {
		m.api.modelFree(m.ptr)
		m.ptr = 0
	}
}

// Name is the model's served name: the file name without its extension.
func (m *Model) Name() string { return m.name }

// Meta returns the GGUF metadata value of key as a string, and whether the
// key exists.
func (m *Model) Meta(key string) (string, bool) {
	buf := make([]byte, 256)
	for {
		n := m.api.modelMetaValStr(m.ptr, key, buf, uintptr(len(buf)))
		if n < 0 {
			return "", false
		}
		if int(n) < len(buf) {
			return string(buf[:n]), true
		}
		buf = make([]byte, int(n)+1)
	}
}

func (m *Model) metaInt(key string) (int, bool) {
	s, ok := m.Meta(key)
	if !ok {
		return 0, false
	}
	v, err := strconv.Atoi(s)
	return v, err == nil
}

// Arch returns general.architecture.
func (m *Model) Arch() string {
	s, _ := m.Meta("general.architecture")
	return s
}

// TrainContext is the context length the model was trained for.
func (m *Model) TrainContext() int { return int(m.api.modelNCtxTrain(m.ptr)) }

// Tokenizer returns the model's tokenizer, which is safe for concurrent use.
func (m *Model) Tokenizer() *Tokenizer { return m.tok }

// Tokenizer is a model's own tokenizer and chat template, through
// llama.cpp. It implements engine.Tokenizer, engine.ChatTemplater and
// engine.EOGTokenizer, and is safe for concurrent use.
type Tokenizer struct {
	m      *Model
	n      int
	eos    int32
	bos    int32
	addBOS bool
	eog    []int32
	tmpl   string // the GGUF's chat template, "" when it has none

	mu     sync.Mutex // llama.cpp's vocabulary calls, one at a time
	pieces [][]byte   // DecodeToken's answers, filled on first use
}

var (
	_ engine.Tokenizer     = (*Tokenizer)(nil)
	_ engine.ChatTemplater = (*Tokenizer)(nil)
	_ engine.EOGTokenizer  = (*Tokenizer)(nil)
)

func newTokenizer(m *Model) *Tokenizer {
	a := m.api
	t := &Tokenizer{m: m, n: int(a.vocabNTokens(m.vocab)), eos: a.vocabEOS(m.vocab), bos: a.vocabBOS(m.vocab), addBOS: a.vocabGetAddBOS(m.vocab)}
	for id := range int32(t.n) {
		if a.vocabIsEOG(m.vocab, id) {
			t.eog = append(t.eog, id)
		}
	}
	t.tmpl = goString(a.modelChatTemplate(m.ptr, nil))
	t.pieces = make([][]byte, t.n)
	return t
}

// Encode tokenizes text as llama-server does: the model's BOS is added when
// its vocabulary asks for it, and special tokens written in the text
// (<|im_start|>, …) are parsed as such. A text of more than 2³¹ tokens,
// which llama.cpp cannot count, gives nil.
func (t *Tokenizer) Encode(text string) []int32 {
	if text == "" && !t.addBOS {
		return []int32{}
	}
	b := []byte(text)
	if len(b) == 0 {
		b = []byte{0} // a valid pointer; the length passed is 0
	}
	ids := make([]int32, len(text)+8)
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		n := t.m.api.tokenize(t.m.vocab, b, int32(len(text)), ids, int32(len(ids)), true, true)
		switch {
		case n >= 0:
			return ids[:n]
		case n == math.MinInt32:
			return nil
		default:
			ids = make([]int32, -n)
		}
	}
}

// DecodeToken returns the bytes of one token, which may be part of a UTF-8
// sequence. Special tokens render as nothing, as llama-server's text does.
func (t *Tokenizer) DecodeToken(id int32) []byte {
	if id < 0 || int(id) >= t.n {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.pieces[id]; p != nil {
		return p
	}
	buf := make([]byte, 32)
	for {
		n := t.m.api.tokenToPiece(t.m.vocab, id, buf, int32(len(buf)), 0, false)
		if n >= 0 {
			p := append(make([]byte, 0, n), buf[:n]...)
			t.pieces[id] = p
			return p
		}
		buf = make([]byte, -n)
	}
}

// TokenText returns the text of one token with special tokens written
// out (<s>, <|begin_of_text|>), as a chat template's bos_token and
// eos_token are; "" for an id outside the vocabulary.
func (t *Tokenizer) TokenText(id int32) string {
	if id < 0 || int(id) >= t.n {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	buf := make([]byte, 64)
	for {
		n := t.m.api.tokenToPiece(t.m.vocab, id, buf, int32(len(buf)), 0, true)
		if n >= 0 {
			return string(buf[:n])
		}
		buf = make([]byte, -n)
	}
}

// AddsBOS reports whether Encode adds the model's BOS token.
func (t *Tokenizer) AddsBOS() bool { return t.addBOS }

// Decode returns the text of ids; ids outside the vocabulary are skipped.
func (t *Tokenizer) Decode(ids []int32) string {
	var sb strings.Builder
	for _, id := range ids {
		sb.Write(t.DecodeToken(id))
	}
	return sb.String()
}

// EOS returns the end-of-sequence id (-1 when the vocabulary has none).
func (t *Tokenizer) EOS() int32 { return t.eos }

// BOS returns the beginning-of-sequence id (-1 when none).
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOG returns every end-of-generation id. The caller must not modify it.
func (t *Tokenizer) EOG() []int32 { return t.eog }

// Vocab returns the vocabulary size.
func (t *Tokenizer) Vocab() int { return t.n }

// ChatTemplate returns the GGUF's chat template ("" when it has none).
func (t *Tokenizer) ChatTemplate() string { return t.tmpl }

// ErrNoChatTemplate is returned by ApplyChatTemplate for a model whose
// chat template llama.cpp does not recognise.
var ErrNoChatTemplate = errors.New("llamacpp: the model has no chat template llama.cpp supports")

// fallbackTemplate is the chat template of a model whose GGUF has none,
// as llama-server does: ChatML.
const fallbackTemplate = "chatml"

// ApplyChatTemplate renders msgs with the model's chat template through
// llama_chat_apply_template (llama.cpp's built-in templates, recognised
// from the GGUF's template text; ChatML when the GGUF has none) and opens
// the assistant's reply. Errors: ErrNoChatTemplate when llama.cpp does not
// support the model's template.
func (t *Tokenizer) ApplyChatTemplate(msgs []engine.ChatMessage) (string, error) {
	tmpl := t.tmpl
	if tmpl == "" {
		tmpl = fallbackTemplate
	}
	// One arena of NUL-terminated strings for the C side; it stays alive
	// (and, Go's heap not moving, in place) until the call returns.
	size := len(tmpl) + 1
	for _, m := range msgs {
		size += len(m.Role) + len(m.Content) + 2
	}
	arena := make([]byte, 0, size)
	put := func(s string) int {
		off := len(arena)
		arena = append(append(arena, s...), 0)
		return off
	}
	tmplOff := put(tmpl)
	offs := make([][2]int, len(msgs))
	total := 0
	for i, m := range msgs {
		offs[i] = [2]int{put(m.Role), put(m.Content)}
		total += len(m.Content) + len(m.Role)
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(arena)))
	chat := make([]chatMessage, len(msgs))
	for i, o := range offs {
		chat[i] = chatMessage{role: base + uintptr(o[0]), content: base + uintptr(o[1])}
	}
	if len(chat) == 0 {
		chat = make([]chatMessage, 1) // a valid pointer; n is 0
	}
	buf := make([]byte, 2*total+256)
	for {
		n := t.m.api.chatApplyTemplate(&arena[tmplOff], chat, uintptr(len(msgs)), true, buf, int32(len(buf)))
		if n < 0 {
			return "", ErrNoChatTemplate
		}
		if int(n) <= len(buf) {
			keepAlive(arena, chat)
			return string(buf[:n]), nil
		}
		buf = make([]byte, n)
	}
}
