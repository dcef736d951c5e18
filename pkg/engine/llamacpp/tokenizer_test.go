package llamacpp

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine"
)

// vectors reads llama.cpp's tokenizer test vectors for a vocab GGUF: the
// texts of NAME.inp (separated as llama.cpp's test-tokenizer-0 does) and
// the ids of NAME.out, one line a text.
func vectors(t *testing.T, gguf string) (texts []string, ids [][]int32) {
	t.Helper()
	inp, err := os.ReadFile(gguf + ".inp")
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(gguf + ".out")
	if err != nil {
		t.Fatal(err)
	}
	texts = strings.Split(string(inp), "\n__ggml_vocab_test__\n")
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(texts) != len(lines) {
		// The .inp ends with a separator line; the last text is then empty.
		texts = texts[:len(lines)]
	}
	for _, l := range lines {
		var row []int32
		for _, f := range strings.Fields(l) {
			v, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("%s.out: %v", gguf, err)
			}
			row = append(row, int32(v))
		}
		ids = append(ids, row)
	}
	return texts, ids
}

// TestTokenizerVectors checks pdserve's prompt token ids (Encode: the
// coordinator's path) against llama.cpp's own test vectors for an SPM and
// two BPE vocabularies: the same ids, after the BOS the vocabulary adds.
func TestTokenizerVectors(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	for _, name := range []string{"llama-spm", "llama-bpe", "qwen2", "phi-3"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(vocab, "ggml-vocab-"+name+".gguf")
			m, err := LoadModel(path, LoadOptions{LibDir: lib, VocabOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			tok := m.Tokenizer()
			texts, want := vectors(t, path)
			if len(texts) < 10 {
				t.Fatalf("only %d test vectors", len(texts))
			}
			for i, text := range texts {
				got := tok.Encode(text)
				var prefix []int32
				if tok.addBOS && tok.BOS() >= 0 {
					prefix = []int32{tok.BOS()}
				}
				if diff := cmp.Diff(append(prefix, want[i]...), got, cmpEmpty); diff != "" {
					t.Errorf("text %d %q: ids (-llama.cpp +pdserve):\n%s", i, text, diff)
				}
			}
		})
	}
}

var cmpEmpty = cmp.Comparer(func(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
})

// TestChatTemplate renders a chat with a vocabulary's own template (qwen2:
// ChatML in its GGUF) and with the fallback of a vocabulary without one
// (llama-spm), as llama-server does.
func TestChatTemplate(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	msgs := []engine.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi ☕"}}
	chatml := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi ☕<|im_end|>\n<|im_start|>assistant\n"
	for _, tc := range []struct {
		vocab, want string
		hasOwn      bool
	}{
		{"qwen2", chatml, true},
		{"llama-spm", chatml, false},
	} {
		t.Run(tc.vocab, func(t *testing.T) {
			m, err := LoadModel(filepath.Join(vocab, "ggml-vocab-"+tc.vocab+".gguf"), LoadOptions{LibDir: lib, VocabOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			tok := m.Tokenizer()
			if got := tok.ChatTemplate() != ""; got != tc.hasOwn {
				t.Errorf("has a template of its own: %v, want %v", got, tc.hasOwn)
			}
			got, err := tok.ApplyChatTemplate(msgs)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("rendered %q, want %q", got, tc.want)
			}
			if tc.hasOwn {
				// The template's special tokens parse as such.
				ids := tok.Encode(got)
				if !slices.ContainsFunc(ids, func(id int32) bool { return slices.Contains(tok.EOG(), id) }) {
					t.Errorf("rendered chat tokenizes without an end-of-generation token (<|im_end|>): %v", ids)
				}
			}
		})
	}
}

// TestMissingLibrary: without the libraries the error names what is
// missing, where, and how to get it.
func TestMissingLibrary(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(model, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadModel(model, LoadOptions{LibDir: dir})
	if !errors.Is(err, ErrNoLibrary) {
		t.Fatalf("LoadModel with no libraries: %v, want ErrNoLibrary", err)
	}
	for _, want := range []string{"libllama*.so", "libggml*.so", dir, "make llama", "--llama-lib", EnvLib} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
