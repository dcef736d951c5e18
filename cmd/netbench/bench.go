package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pdserve/pdserve/internal/netlab"
)

// benchMain builds the lab (namespaces prefill and decode, one veth
// link), starts serve in decode, and per link speed shapes the link and
// runs send in prefill, whose JSON line it prints. It returns the exit
// code (2: --check failed).
func benchMain(ctx context.Context, args []string) (int, error) {
	fs := flag.NewFlagSet("netbench", flag.ContinueOnError)
	speeds := fs.String("gbps", "1,10,25", "link speeds, Gb/s, comma separated")
	delay := fs.Duration("delay", 500*time.Microsecond, "one-way delay of the link (netem; left out where the kernel lacks it)")
	kvMiB := fs.Int("kv-mib", 64, "KV per transfer, MiB")
	reps := fs.Int("reps", 3, "timed transfers per codec and speed (the median is reported)")
	streams := fs.String("streams", "", "also time codec none split over k concurrent streams, per k (e.g. 1,2,4; empty: skip)")
	chunks := fs.String("chunks", "", "also time codec none handed over in chunks of these many tokens (e.g. 16,128,1024; empty: skip)")
	check := fs.Bool("check", false, "exit 2 unless adaptive is within 5% of the best fixed codec at every speed and ≥1.3× faster than none on the slowest")
	if err := fs.Parse(args); err != nil {
		return 1, err
	}
	var gbps []float64
	for _, f := range strings.Split(*speeds, ",") {
		g, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || g <= 0 {
			return 1, fmt.Errorf("--gbps %q: want positive numbers", *speeds)
		}
		gbps = append(gbps, g)
	}
	self, err := os.Executable()
	if err != nil {
		return 1, err
	}

	lab, err := netlab.New(ctx)
	if errors.Is(err, netlab.ErrUnsupported) {
		if os.Getenv("CI") == "true" && os.Geteuid() == 0 {
			return 1, err // CI runs as root: the harness must work there
		}
		return 1, fmt.Errorf("%w: %v", errSkip, err)
	}
	if err != nil {
		return 1, err
	}
	defer lab.Close()
	pns, err := lab.AddNamespace(ctx, "prefill")
	if err != nil {
		return 1, err
	}
	dns, err := lab.AddNamespace(ctx, "decode")
	if err != nil {
		return 1, err
	}
	link, err := lab.Connect(ctx, pns, dns, netlab.Shape{})
	if err != nil {
		return 1, err
	}
	grpcAddr := net.JoinHostPort(link.AddrB.String(), "7100")
	rawAddr := net.JoinHostPort(link.AddrB.String(), "7101")

	srv := dns.Command(ctx, self, "serve", "--grpc", grpcAddr, "--raw", rawAddr)
	srv.Stderr = os.Stderr
	out, err := srv.StdoutPipe()
	if err != nil {
		return 1, err
	}
	if err := lab.Start(srv); err != nil {
		return 1, err
	}
	defer func() {
		_ = srv.Process.Signal(os.Interrupt)
		_ = srv.Wait()
	}()
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		return 1, fmt.Errorf("decode side exited before it was ready: %v", sc.Err())
	}
	ready := sc.Text()
	var rl readyLine
	if err := json.Unmarshal([]byte(ready), &rl); err != nil || !rl.Ready {
		return 1, fmt.Errorf("decode side said %q", ready)
	}

	code := 0
	var slowest *result
	for _, g := range gbps {
		d := *delay
		err := link.SetShape(ctx, netlab.Shape{RateBitsPerSec: g * 1e9, Delay: d})
		if errors.Is(err, netlab.ErrNoNetem) {
			fmt.Fprintf(os.Stderr, "netbench: %v: shaping the rate only, no delay\n", err)
			d = 0
			err = link.SetShape(ctx, netlab.Shape{RateBitsPerSec: g * 1e9})
		}
		if err != nil {
			return 1, err
		}
		snd := pns.Command(ctx, self, "send", "--grpc", grpcAddr, "--raw", rawAddr,
			"--gbps", strconv.FormatFloat(g, 'f', -1, 64), "--delay", d.String(),
			"--kv-mib", strconv.Itoa(*kvMiB), "--reps", strconv.Itoa(*reps), "--receiver", ready,
			"--streams", *streams, "--chunks", *chunks)
		snd.Stderr = os.Stderr
		var buf strings.Builder
		snd.Stdout = &buf
		if err := lab.Start(snd); err != nil {
			return 1, err
		}
		if err := snd.Wait(); err != nil {
			return 1, fmt.Errorf("send at %g Gb/s: %w", g, err)
		}
		line := strings.TrimSpace(buf.String())
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return 1, fmt.Errorf("send at %g Gb/s printed %q: %w", g, line, err)
		}
		fmt.Println(line)
		if r.AdaptiveOverBest > 1.05 {
			fmt.Fprintf(os.Stderr, "netbench: at %g Gb/s adaptive (%s) took %.3gx the best fixed codec (%s)\n", g, r.AdaptiveCodec, r.AdaptiveOverBest, r.BestFixedCodec)
			if *check {
				code = 2
			}
		}
		if slowest == nil || r.LinkGbps < slowest.LinkGbps {
			slowest = &r
		}
	}
	if slowest != nil && slowest.NoneOverAdaptive < 1.3 {
		fmt.Fprintf(os.Stderr, "netbench: on the slowest link (%g Gb/s) adaptive is %.3gx faster than none, want ≥ 1.3x\n", slowest.LinkGbps, slowest.NoneOverAdaptive)
		if *check {
			code = 2
		}
	}
	return code, nil
}
