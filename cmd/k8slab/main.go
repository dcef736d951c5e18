// Command k8slab starts, checks and stops the repository's single-machine
// Kubernetes cluster (internal/k8slab): `make k8s-up` is `k8slab up`,
// `make k8s-down` is `k8slab down`.
//
//	k8slab build                  build the pinned binaries into the cache (no root)
//	k8slab up [--no-kwok]         start what is not running, wait until healthy, print the env
//	k8slab smoke [--keep]         pod Ready, Service by DNS from a pod, Service IP from the node
//	k8slab status                 each component's pid and the API server's readiness
//	k8slab env                    print export KUBECONFIG=… and PATH for kubectl
//	k8slab down                   stop everything, clean the network, remove the state
//
// Common flags: --repo (default: the directory holding go.mod above the
// working directory), --state (default REPO/.pdserve/k8s), --cache
// (default ${XDG_CACHE_HOME:-~/.cache}/pdserve/k8s), --node-ip (default
// the default route's source address). Exit status: 0 on success, 1 on a
// failure (the message names the step and the component's log), 2 on a
// usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/pdserve/pdserve/internal/k8slab"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: k8slab build|up|smoke|status|env|down [flags]")
		return 2
	}
	sub := args[0]
	fs := flag.NewFlagSet("k8slab "+sub, flag.ContinueOnError)
	var opt k8slab.Options
	fs.StringVar(&opt.Repo, "repo", "", "repository root (default: the directory holding go.mod above the working directory)")
	fs.StringVar(&opt.State, "state", "", "runtime state directory (default REPO/.pdserve/k8s)")
	fs.StringVar(&opt.Cache, "cache", "", "binary cache (default ${XDG_CACHE_HOME:-~/.cache}/pdserve/k8s)")
	fs.StringVar(&opt.NodeIP, "node-ip", "", "the node's IPv4 address (default: the default route's source)")
	noKwok := fs.Bool("no-kwok", false, "up: do not start kwok and the simulated GPU nodes")
	keep := fs.Bool("keep", false, "smoke: keep the smoke namespace")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	opt.KwokNodes = !*noKwok
	if opt.Repo == "" {
		r, err := findRepo()
		if err != nil {
			fmt.Fprintln(os.Stderr, "k8slab:", err)
			return 2
		}
		opt.Repo = r
	}
	lab, err := k8slab.New(opt)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	switch sub {
	case "build":
		err = lab.Build(ctx)
	case "up":
		if err = lab.Up(ctx); err == nil {
			fmt.Println(lab.Env())
		}
	case "smoke":
		var res k8slab.SmokeResult
		t := time.Now()
		res, err = lab.Smoke(ctx, *keep)
		fmt.Printf("smoke: pod Ready in %s; Service %s\nsmoke: in pod: %s\nsmoke: from node: %q\n", res.PodReady.Round(100*time.Millisecond), res.ServiceIP, res.InPod, res.FromNode)
		if res.KwokPlaced != "" {
			fmt.Printf("smoke: GPU pod with the prefill pool's selector and tolerations on %s\n", res.KwokPlaced)
		}
		if err == nil {
			fmt.Printf("smoke: ok in %s\n", time.Since(t).Round(100*time.Millisecond))
		}
	case "status":
		var st []k8slab.ComponentState
		st, err = lab.Status(ctx)
		for _, c := range st {
			state := "stopped"
			if c.Running {
				state = fmt.Sprintf("running pid %d", c.Pid)
			}
			fmt.Printf("%-24s %-18s %s\n", c.Name, state, c.Log)
		}
	case "env":
		fmt.Println(lab.Env())
	case "down":
		err = lab.Down()
	default:
		fmt.Fprintln(os.Stderr, "k8slab: unknown command", sub)
		return 2
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory (give --repo)")
		}
		dir = parent
	}
}
