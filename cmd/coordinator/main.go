// Command coordinator runs the pdserve coordinator: the OpenAI-compatible
// API, membership of the workers, routing and the request flow. With
// --standalone it also runs prefill and decode workers in process, so one
// command serves a model. Subcommands: profiles, calibrate, plan, hash-key
// (package coordinatorrun). Run it with
// --help for its flags.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pdserve/pdserve/pkg/coordinatorrun"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return coordinatorrun.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
}
