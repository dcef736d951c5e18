package kv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func mustKey(t testing.TB, s string) HashKey {
	t.Helper()
	k, err := NewHashKey([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// A key changes every hash, so that nobody without it computes them from
// known text; the same key gives the same chain, which keeps the chain
// property of HashBlocks.
func TestHashKeyBlocks(t *testing.T) {
	const bt = 4
	a, b := mustKey(t, strings.Repeat("a", 32)), mustKey(t, strings.Repeat("b", 32))
	toks := seqTokens(22)
	plain, ka, ka2, kb := HashBlocks(0, toks, bt), a.Blocks(0, toks, bt), a.Blocks(0, toks, bt), b.Blocks(0, toks, bt)
	if len(ka) != 5 {
		t.Fatalf("keyed chain of 22 tokens in blocks of 4: %d hashes, want 5", len(ka))
	}
	if diff := cmp.Diff(ka, ka2); diff != "" {
		t.Errorf("same key, same tokens, different hashes:\n%s", diff)
	}
	for i := range ka {
		if ka[i] == plain[i] || ka[i] == kb[i] {
			t.Errorf("block %d: keyed hash %x equals the unkeyed (%x) or another key's (%x)", i, ka[i], plain[i], kb[i])
		}
	}
	// The chain continues from a parent like HashBlocks.
	if diff := cmp.Diff(ka[2:], a.Blocks(ka[1], toks[8:], bt)); diff != "" {
		t.Errorf("continued chain differs:\n%s", diff)
	}
	// No key: HashBlocks itself.
	if diff := cmp.Diff(plain, HashKey{}.Blocks(0, toks, bt)); diff != "" {
		t.Errorf("the zero key must hash as HashBlocks:\n%s", diff)
	}
}

func TestHashKeyRootAndID(t *testing.T) {
	a, b := mustKey(t, strings.Repeat("a", 32)), mustKey(t, strings.Repeat("b", 32))
	if a.Root("") != 0 || (HashKey{}).Root("") != 0 {
		t.Error("the empty namespace must be the plain root")
	}
	if a.Root("t1") == a.Root("t2") || a.Root("t1") == b.Root("t1") || a.Root("t1") == RootHash("t1") {
		t.Error("roots must differ by namespace and by key, and a keyed root from the public one")
	}
	if (HashKey{}).Root("t1") != RootHash("t1") {
		t.Error("without a key a root is RootHash")
	}
	if a.ID() == "" || a.ID() == b.ID() || len(a.ID()) != 16 || (HashKey{}).ID() != "" {
		t.Errorf("IDs %q %q: want 16 hex digits, distinct; none without a key", a.ID(), b.ID())
	}
	if strings.Contains(a.ID(), "61616161") {
		t.Error("the ID shows the secret")
	}
	if g1, g2 := GenerateHashKey(), GenerateHashKey(); !g1.Keyed() || g1 == g2 {
		t.Error("generated keys must be keys and differ")
	}
}

func TestLoadHashKey(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "k")
	if err := os.WriteFile(good, []byte("  "+strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := LoadHashKey(good)
	if err != nil {
		t.Fatal(err)
	}
	if k != mustKey(t, strings.Repeat("ab", 32)) {
		t.Error("white space around the secret must be dropped")
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("tooshort-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadHashKey(short); err == nil || strings.Contains(err.Error(), "tooshort") {
		t.Errorf("short key: err %v, want an error not naming the content", err)
	}
	if _, err := LoadHashKey(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file must fail")
	}
}

func BenchmarkHashKeyBlocks(b *testing.B) {
	k := mustKey(b, strings.Repeat("k", 32))
	toks := seqTokens(16 * 1024)
	b.SetBytes(int64(4 * len(toks)))
	for b.Loop() {
		k.Blocks(0, toks, 16)
	}
}

func BenchmarkHashBlocksUnkeyed(b *testing.B) {
	toks := seqTokens(16 * 1024)
	b.SetBytes(int64(4 * len(toks)))
	for b.Loop() {
		HashBlocks(0, toks, 16)
	}
}
