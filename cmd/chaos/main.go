// Command chaos runs pdserve as separate processes, each in its own
// network namespace on one switch (internal/netlab): a coordinator with
// embedded NATS, two prefill workers (links shaped with tc) and two decode
// workers. It drives them with the loadtest at about 70 % of their
// measured capacity (ref engine, greedy), injects one fault per run and
// prints one JSON line per fault: requests completed, failed and retried
// (decode recoveries and prefill retries), whether the completed outputs
// equal the no-fault run's, the KV blocks and prefill bytes left held on
// every live worker once the run settled (and how long that took), and the
// workers' goroutines before and after.
//
//	chaos --bin DIR [--faults kill-decode,stop-decode,kill-prefill,partition] [--duration 6s] [--link-gbps 1]
//
// DIR holds coordinator, prefill-worker, decode-worker and loadtest
// (make chaos builds them). Faults: kill-decode (kill -9 of a decode worker
// while transfers and decodes are in flight), stop-decode (SIGSTOP of a
// decode worker for 10 s), kill-prefill (kill -9 of a prefill worker),
// partition (a prefill worker cut off from both decode workers for 5 s by
// blackhole routes). Where network namespaces are not allowed it prints
// why and exits 0, except under CI=true as root (exit 1).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := chaosMain(ctx, os.Args[1:])
	if errors.Is(err, errSkip) {
		fmt.Fprintf(os.Stderr, "chaos: skipped: %v\n", err)
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
	return code
}
