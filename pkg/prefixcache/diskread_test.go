package prefixcache

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
)

// TestDiskReadGivesUp: a read of a disk-tier file that does not return
// (a hung disk) is given up after the tier's timeout, or when the
// caller's context ends, without waiting for it: ReadDisk returns nothing
// (the prefix is computed), the failure is counted, and the entry stays
// (a slow disk is not a bad file). The read's goroutine ends when the
// read does.
func TestDiskReadGivesUp(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 256})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{MaxTokens: 1 << 10, MaxEntries: 1, BlockTokens: 16,
		HostBytes: int64(40 * eng.Spec().KVBytesPerToken()), DiskDir: t.TempDir(), DiskBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Free(eng, c.Drain()) }()
	prompts := make([][]int32, 3)
	for i := range prompts {
		p := make([]int32, 40)
		for j := range p {
			p[j] = int32(3 + (i*31+j*7)%240)
		}
		prompts[i] = p
		seq := engine.SeqID(i + 1)
		if _, err := eng.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: p, Last: true}}, nil); err != nil {
			t.Fatal(err)
		}
		if err := c.Free(eng, c.Insert(seq, c.Hashes(0, p), len(p))); err != nil {
			t.Fatal(err)
		}
	}
	d := c.Host().Disk()
	hashes := c.Hashes(0, prompts[0])
	if d.Match(hashes) != 2 {
		t.Fatalf("disk tier %+v: want the first prompt's two blocks", d.Stats())
	}
	release := make(chan struct{})
	ended := make(chan struct{}, 2)
	d.readFile = func(string, int64) ([]byte, error) {
		defer func() { ended <- struct{}{} }()
		<-release
		return nil, errors.New("the hung read returned")
	}
	d.timeout = time.Millisecond
	if r := c.ReadDisk(context.Background(), hashes, 2); r != nil {
		t.Error("ReadDisk returned a read that never ended")
	}
	d.timeout = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r := c.ReadDisk(ctx, hashes, 2); r != nil {
		t.Error("ReadDisk returned a read after its context ended")
	}
	st := d.Stats()
	if st.Failures != 2 || st.BadEntries != 0 || d.Match(hashes) != 2 {
		t.Errorf("disk tier %+v after two reads given up: want 2 failures, the entry kept", st)
	}
	close(release)
	<-ended
	<-ended
}
