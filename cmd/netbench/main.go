// Command netbench measures the time to deliver one request's KV from a
// prefill network namespace to a decode network namespace over a link
// shaped with tc (internal/netlab), with every fixed lossless codec, with
// the adaptive choice (codec "auto") and with raw TCP for reference. It
// prints one JSON object per link speed.
//
// It is a program of its own rather than a loadtest subcommand: loadtest
// drives OpenAI-compatible HTTP endpoints, while netbench drives the KV
// data plane (pkg/kvtransfer) directly and re-executes itself inside the
// namespaces it made (subcommands serve and send), which needs root.
//
//	netbench [--gbps 1,10,25] [--delay 500us] [--kv-mib 64] [--reps 3] [--streams 1,2,4] [--chunks 16,128,1024] [--check]
//
// Exit status: 0, 1 on an error, 2 when --check is given and the
// adaptive choice missed (more than 5 % slower than the best fixed codec
// at some speed, or less than 1.3× faster than none on the slowest link).
// Where network namespaces are not allowed (not root, EPERM) it prints
// why and exits 0 without figures, except under CI=true as root, where
// the harness must work and a failure exits 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	args := os.Args[1:]
	sub := ""
	if len(args) > 0 && (args[0] == "serve" || args[0] == "send") {
		sub, args = args[0], args[1:]
	}
	var err error
	switch sub {
	case "serve":
		err = serveMain(ctx, args)
	case "send":
		err = sendMain(ctx, args)
	default:
		var code int
		code, err = benchMain(ctx, args)
		if err == nil {
			return code
		}
		if errors.Is(err, errSkip) {
			fmt.Fprintf(os.Stderr, "netbench: skipped: %v\n", err)
			return 0
		}
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "netbench %s: %v\n", sub, err)
		return 1
	}
	return 0
}

// printJSON writes v as one line.
func printJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Println(string(b))
	return err
}
