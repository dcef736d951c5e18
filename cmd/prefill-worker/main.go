// Command prefill-worker runs a pdserve prefill worker: it prefills queued
// prompts in batched chunks and streams their KV to decode workers. Run it
// with --help for its flags.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pdserve/pdserve/pkg/workerrun"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return workerrun.Main(ctx, "prefill-worker", workerrun.NewPrefillOptions(), os.Args[1:], os.Stdout, os.Stderr)
}
