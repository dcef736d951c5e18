// Command chaos runs pdserve as separate processes, each in its own
// network namespace on one switch (internal/netlab): a NATS server, a
// coordinator, two prefill workers (links shaped with tc) and two decode
// workers. It drives them with the loadtest at about 70 % of their
// measured capacity (ref engine, greedy), injects one fault per run and
// prints one JSON line per fault: requests completed, failed, retried
// (decode recoveries and prefill retries) and rejected with 429; whether
// the completed outputs equal the no-fault run's; the KV blocks and
// prefill bytes left held on every live worker once the run settled (and
// how long that took); the goroutines before and after; SLO attainment,
// the KV transfer per request and every process's peak RSS.
//
//	chaos --bin DIR [--faults F,...] [--duration 6s] [--link-gbps 1] [--engine-flags "..."]
//
// DIR holds coordinator, prefill-worker, decode-worker and loadtest
// (make chaos builds them); the NATS server is this binary (chaos nats),
// in a namespace of its own as the chart runs it. Faults:
//   - kill-decode-transfer: kill -9 of a decode worker while KV is
//     arriving at it (pdserve_decode_kv_transfers ≥ 1);
//   - kill-decode-decoding: kill -9 of a decode worker while it decodes
//     and receives no KV;
//   - stop-decode: SIGSTOP of a decode worker for 10 s;
//   - kill-prefill: kill -9 of a prefill worker;
//   - partition: a prefill worker cut off from both decode workers for
//     5 s by blackhole routes;
//   - restart-nats: kill -9 of the NATS server, restarted 3 s later;
//   - restart-coordinator: kill -9 of the coordinator, restarted at once;
//   - overload: no fault, --overload-x (10) times the measured capacity,
//     with the coordinator admitting --overload-queue-limit requests at
//     once: 429s, the admitted requests' SLO attainment, peak RSS.
//
// Where network namespaces are not allowed it prints why and exits 0,
// except under CI=true as root (exit 1).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/pdserve/pdserve/pkg/control"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "nats" {
		if err := natsMain(ctx, os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "chaos nats: %v\n", err)
			return 1
		}
		return 0
	}
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

// natsMain is "chaos nats --listen HOST:PORT --auth-file FILE": the
// control plane's NATS server as a process of its own, with the users and
// role permissions of FILE (control.LoadUsers, as the coordinator's
// --nats-auth-file), so that a fault can kill and restart it. It serves
// until SIGINT or SIGTERM.
func natsMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("chaos nats", flag.ContinueOnError)
	listen := fs.String("listen", "", "listen address, host:port")
	authFile := fs.String("auth-file", "", "YAML file of the users (control.LoadUsers)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *listen == "" || *authFile == "" {
		return errors.New("--listen and --auth-file are required")
	}
	users, err := control.LoadUsers(*authFile)
	if err != nil {
		return err
	}
	s, _, err := control.StartEmbedded(*listen, control.WithUsers(users))
	if err != nil {
		return err
	}
	<-ctx.Done()
	s.Shutdown()
	s.WaitForShutdown()
	return nil
}
