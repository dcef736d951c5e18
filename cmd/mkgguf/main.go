// Command mkgguf writes a random-weight GGUF model of a real llama.cpp
// architecture over a real tokenizer (see package gguf), for testing and
// benchmarking the llama.cpp engine without pretrained weights. The
// model's output is gibberish. Run it with --help for its flags.
//
//	mkgguf --shape tiny-qwen2 --type q8_0 --seed 1 --out /tmp/m.gguf
//	mkgguf --arch qwen2 --vocab third_party/llama/vocab/ggml-vocab-qwen2.gguf \
//	    --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --ctx 2048 \
//	    --type q8_0 --seed 1 --out /tmp/m.gguf
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return mkgguf(ctx, os.Args[1:], os.Stdout, os.Stderr)
}
