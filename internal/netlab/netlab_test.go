package netlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary act as a tiny TCP tool inside a
// namespace: NETLAB_HELPER=serve listens and counts the bytes it reads,
// NETLAB_HELPER=send writes a number of bytes and prints the seconds it
// took until the server acknowledged them.
func TestMain(m *testing.M) {
	switch os.Getenv("NETLAB_HELPER") {
	case "serve":
		os.Exit(helperServe(os.Getenv("NETLAB_ADDR")))
	case "send":
		os.Exit(helperSend(os.Getenv("NETLAB_ADDR"), 8<<20))
	case "dial":
		c, err := net.DialTimeout("tcp", os.Getenv("NETLAB_ADDR"), time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		c.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helperServe(addr string) int {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	for {
		c, err := lis.Accept()
		if err != nil {
			return 1
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 8)
			if _, err := io.ReadFull(c, buf); err != nil {
				return // a dial probe
			}
			want := int64(0)
			for _, b := range buf {
				want = want<<8 | int64(b)
			}
			if n, err := io.CopyN(io.Discard, c, want); err != nil || n != want {
				return
			}
			_, _ = c.Write([]byte{1})
		}()
	}
}

func helperSend(addr string, n int64) int {
	var c net.Conn
	var err error
	for i := 0; i < 100; i++ { // the server may not listen yet
		if c, err = net.Dial("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	t0 := time.Now()
	hdr := make([]byte, 8)
	for i := range hdr {
		hdr[i] = byte(n >> (8 * (7 - i)))
	}
	if _, err := c.Write(hdr); err != nil {
		return 1
	}
	if _, err := io.CopyN(c, zeroReader{}, n); err != nil {
		return 1
	}
	if _, err := io.ReadFull(c, hdr[:1]); err != nil {
		return 1
	}
	fmt.Printf("%d %f\n", n, time.Since(t0).Seconds())
	return 0
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestLabShapedLink(t *testing.T) {
	l := NewForTest(t)
	ctx := context.Background()
	a, err := l.AddNamespace(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.AddNamespace(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	const rate = 200e6
	k, err := l.Connect(ctx, a, b, Shape{})
	if err != nil {
		t.Fatal(err)
	}
	err = k.SetShape(ctx, Shape{RateBitsPerSec: rate, Delay: 500 * time.Microsecond})
	if errors.Is(err, ErrNoNetem) {
		t.Logf("%v: shaping rate only", err)
		err = k.SetShape(ctx, Shape{RateBitsPerSec: rate})
	}
	if err != nil {
		t.Fatal(err)
	}
	if !LabNet.Contains(k.AddrA) || !LabNet.Contains(k.AddrB) {
		t.Fatalf("addresses %v, %v outside %v", k.AddrA, k.AddrB, LabNet)
	}

	// The veths live only inside the namespaces.
	if out, err := exec.Command("ip", "link", "show", k.DevA).CombinedOutput(); err == nil {
		t.Fatalf("%s visible outside its namespace: %s", k.DevA, out)
	}

	// A shaped transfer: 8 MiB from a to b. Loose sanity band only.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(k.AddrB.String(), "7000")
	srv := b.Command(ctx, self)
	srv.Env = append(os.Environ(), "NETLAB_HELPER=serve", "NETLAB_ADDR="+addr)
	srvOut, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(srv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	line := make([]byte, 6)
	if _, err := io.ReadFull(srvOut, line); err != nil || string(line) != "ready\n" {
		t.Fatalf("server: %q, %v", line, err)
	}
	// Connectivity, then the transfer.
	if err := dial(ctx, a, self, addr); err != nil {
		t.Fatalf("dial %s from a: %v", addr, err)
	}
	snd := a.Command(ctx, self)
	snd.Env = append(os.Environ(), "NETLAB_HELPER=send", "NETLAB_ADDR="+addr)
	out, err := snd.Output()
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	var n int64
	var secs float64
	if _, err := fmt.Sscan(strings.TrimSpace(string(out)), &n, &secs); err != nil {
		t.Fatalf("send printed %q: %v", out, err)
	}
	got := float64(n) * 8 / secs
	t.Logf("shaped %.0f Mb/s, transfer %.1f Mb/s", rate/1e6, got/1e6)
	if got > 1.5*rate || got < 0.05*rate {
		t.Errorf("transfer at %.1f Mb/s on a %.0f Mb/s link: shaping not in effect", got/1e6, rate/1e6)
	}

	// Partition and heal.
	if err := k.SetUp(ctx, false); err != nil {
		t.Fatal(err)
	}
	if dial(ctx, a, self, addr) == nil {
		t.Error("dial across a partitioned link succeeded")
	}
	if err := k.SetUp(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := k.SetShape(ctx, Shape{}); err != nil {
		t.Fatal(err)
	}
	if err := dial(ctx, a, self, addr); err != nil {
		t.Fatalf("dial after healing: %v", err)
	}
}

// dial connects from n to addr (a process of the test binary in n).
func dial(ctx context.Context, n *Namespace, self, addr string) error {
	c := n.Command(ctx, self)
	c.Env = append(os.Environ(), "NETLAB_HELPER=dial", "NETLAB_ADDR="+addr)
	out, err := c.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

func TestCloseKillsAndRemoves(t *testing.T) {
	l := NewForTest(t)
	ctx := context.Background()
	a, err := l.AddNamespace(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.AddNamespace(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Connect(ctx, a, b, Shape{}); err != nil {
		t.Fatal(err)
	}
	sleep := a.Command(ctx, "sleep", "600")
	if err := l.Start(sleep); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sleep.Wait() }()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("process in the namespace survived Close")
	}
	left, err := List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range left {
		for _, m := range l.Namespaces() {
			if n == m {
				t.Errorf("namespace %s left after Close", n)
			}
		}
	}
	if _, err := l.AddNamespace(ctx, "c"); err == nil {
		t.Error("AddNamespace after Close succeeded")
	}
}

func TestSweepRemovesDeadRuns(t *testing.T) {
	NewForTest(t) // skips where namespaces are not allowed
	ctx := context.Background()
	// A pid that does not run: one past the max is never a process.
	stale := prefix + "4194305-dead00-x"
	if out, err := runIP(ctx, "netns", "add", stale); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { _ = deleteNS(stale) })
	if err := Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	left, _ := List(ctx)
	for _, n := range left {
		if n == stale {
			t.Fatalf("Sweep left %s", n)
		}
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{{"a", true}, {"decode-1", true}, {"", false}, {"a b", false}, {"../x", false}, {strings.Repeat("x", 17), false}} {
		if got := validName.MatchString(tc.name); got != tc.ok {
			t.Errorf("validName(%q) = %v, want %v", tc.name, got, tc.ok)
		}
	}
}

func TestSwitch(t *testing.T) {
	l := NewForTest(t)
	ctx := context.Background()
	sw, err := l.AddSwitch(ctx, "hub")
	if err != nil {
		t.Fatal(err)
	}
	var links []*Link
	for _, name := range []string{"x", "y", "z"} {
		n, err := l.AddNamespace(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		k, err := sw.Attach(ctx, n, Shape{RateBitsPerSec: 1e9})
		if err != nil {
			t.Fatal(err)
		}
		if !LabNet.Contains(k.AddrA) {
			t.Fatalf("address %v outside %v", k.AddrA, LabNet)
		}
		links = append(links, k)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(links[2].AddrA.String(), "7000")
	srv := links[2].A.Command(ctx, self)
	srv.Env = append(os.Environ(), "NETLAB_HELPER=serve", "NETLAB_ADDR="+addr)
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(srv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil {
		t.Fatal(err)
	}
	for _, k := range links[:2] {
		if err := dial(ctx, k.A, self, addr); err != nil {
			t.Errorf("dial %s from %s: %v", addr, k.A.Name, err)
		}
	}
	// Cutting x's link cuts x only.
	if err := links[0].SetUp(ctx, false); err != nil {
		t.Fatal(err)
	}
	if dial(ctx, links[0].A, self, addr) == nil {
		t.Error("dial from a cut namespace succeeded")
	}
	if err := dial(ctx, links[1].A, self, addr); err != nil {
		t.Errorf("dial from y while x is cut: %v", err)
	}
}
