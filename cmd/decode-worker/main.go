// Command decode-worker runs a pdserve decode worker (--role decode), which
// receives KV from prefill workers and decodes in continuous batches, or a
// colocated worker (--role colocated), which also prefills locally. Run it
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
	return workerrun.Main(ctx, "decode-worker", workerrun.NewDecodeOptions(), os.Args[1:], os.Stdout, os.Stderr)
}
