package kv

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func seqTokens(n int) []int32 {
	ts := make([]int32, n)
	for i := range ts {
		ts[i] = int32(i*7919%50021 - 1000) // negative ids too: all 32 bits are hashed
	}
	return ts
}

func TestHashBlocksCountsFullBlocks(t *testing.T) {
	for _, tc := range []struct{ tokens, blockTokens, want int }{
		{0, 4, 0}, {3, 4, 0}, {4, 4, 1}, {7, 4, 1}, {8, 4, 2}, {33, 16, 2}, {10, 0, 0}, {10, -1, 0},
	} {
		got := HashBlocks(0, seqTokens(tc.tokens), tc.blockTokens)
		if len(got) != tc.want {
			t.Errorf("HashBlocks(%d tokens, block %d) gave %d hashes, want %d", tc.tokens, tc.blockTokens, len(got), tc.want)
		}
	}
}

func TestHashBlocksEqualPrefixesEqualHashes(t *testing.T) {
	const bt = 4
	a := seqTokens(23)
	b := append(append([]int32{}, a[:16]...), 9, 9, 9, 9, 9, 9, 9, 9) // shares 4 blocks
	ha, hb := HashBlocks(0, a, bt), HashBlocks(0, b, bt)
	if diff := cmp.Diff(ha[:4], hb[:4]); diff != "" {
		t.Errorf("hashes of a shared 4-block prefix differ (-a +b):\n%s", diff)
	}
	for i := 4; i < min(len(ha), len(hb)); i++ {
		if ha[i] == hb[i] {
			t.Errorf("block %d: sequences diverged at block 4 but hashes are equal", i)
		}
	}
	// The partial tail is ignored: changing or dropping it changes nothing.
	tail := append(append([]int32{}, a[:20]...), -5, -6, -7)
	if diff := cmp.Diff(ha, HashBlocks(0, tail, bt)); diff != "" {
		t.Errorf("changing the partial tail changed the hashes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(ha, HashBlocks(0, a[:20], bt)); diff != "" {
		t.Errorf("dropping the partial tail changed the hashes (-want +got):\n%s", diff)
	}
}

// TestHashBlocksDependOnEveryEarlierToken changes one token at every
// position in turn: every block hash from that token's block on must change,
// and none before it.
func TestHashBlocksDependOnEveryEarlierToken(t *testing.T) {
	const bt = 4
	base := seqTokens(24)
	want := HashBlocks(0, base, bt)
	for pos := range base {
		t.Run(fmt.Sprint(pos), func(t *testing.T) {
			mod := append([]int32{}, base...)
			mod[pos] ^= 1 << (pos % 31)
			got := HashBlocks(0, mod, bt)
			for i := range want {
				if same := got[i] == want[i]; same != (i < pos/bt) {
					t.Errorf("block %d: hash equal = %v after changing token %d, want %v", i, same, pos, i < pos/bt)
				}
			}
		})
	}
	// The same tokens split into different block sizes hash apart, and so do
	// the same blocks in a different order.
	if got := HashBlocks(0, base, 8); got[0] == want[1] {
		t.Error("8-token block hash equals the chained 4-token hash")
	}
	swapped := append(append([]int32{}, base[4:8]...), base[:4]...)
	if got := HashBlocks(0, swapped, bt); got[1] == want[1] {
		t.Error("swapping two blocks kept the second hash")
	}
}

func TestHashBlocksChainContinues(t *testing.T) {
	const bt = 4
	ts := seqTokens(20)
	all := HashBlocks(0, ts, bt)
	rest := HashBlocks(all[1], ts[2*bt:], bt)
	if diff := cmp.Diff(all[2:], rest); diff != "" {
		t.Errorf("continuing the chain from block 1 (-want +got):\n%s", diff)
	}
	// Different roots separate namespaces.
	other := HashBlocks(RootHash("llama-3-8b"), ts, bt)
	if other[0] == all[0] {
		t.Error("hashes under a namespace root equal the plain ones")
	}
	if RootHash("") != 0 || RootHash("a") == RootHash("b") {
		t.Errorf("RootHash: %x %x %x", RootHash(""), RootHash("a"), RootHash("b"))
	}
}

// TestHashBlocksGolden pins the hash function: hashes travel between
// processes (heartbeats), so any change to them is a wire-format change.
func TestHashBlocksGolden(t *testing.T) {
	got := HashBlocks(0, []int32{1, 2, 3, 4, 5, 6, 7, 8, -1}, 4)
	want := []Hash{0x8752c74bc787fd40, 0x1ee3cf25ba75d83e}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("hash chain changed (-want +got):\n%s", diff)
	}
	if got, want := RootHash("pdserve"), Hash(0xc19ac371dd2c4d19); got != want {
		t.Errorf("RootHash(pdserve) = %#x, want %#x", got, want)
	}
}
