// Command natsbytes counts the messages and payload bytes of pdserve's
// heartbeats (pdserve.hb.>) and KV events (pdserve.kv.>) on a NATS server
// from its start until SIGINT or SIGTERM, then writes them as JSON to
// --out: the control plane's traffic during a load test
// (loadtest/results/kv-events/run.sh). It logs in as a user of the
// coordinator role, which may read both.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// count is one subject family's traffic.
type count struct {
	Msgs  int64 `json:"msgs"`
	Bytes int64 `json:"bytes"` // payloads only, without NATS protocol overhead
}

type report struct {
	Seconds float64 `json:"seconds"`
	HB      count   `json:"heartbeats"`
	KV      count   `json:"kv_events"`
	// DigestHashes is the most prefix-digest hashes one heartbeat
	// carried.
	DigestHashes int `json:"digest_hashes_max"`
}

func main() { os.Exit(run()) }

func run() int {
	url := flag.String("url", "nats://127.0.0.1:4222", "NATS URL")
	user := flag.String("user", "", "NATS user (coordinator role)")
	pwFile := flag.String("password-file", "", "file holding the user's password")
	out := flag.String("out", "", "JSON file to write (empty: stdout)")
	flag.Parse()
	var opts []nats.Option
	if *user != "" {
		pw, err := os.ReadFile(*pwFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "natsbytes:", err)
			return 2
		}
		opts = append(opts, nats.UserInfo(*user, strings.TrimSpace(string(pw))))
	}
	nc, err := nats.Connect(*url, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "natsbytes:", err)
		return 1
	}
	defer nc.Close()
	var mu sync.Mutex
	var r report
	for subj, c := range map[string]*count{"pdserve.hb.>": &r.HB, "pdserve.kv.>": &r.KV} {
		if _, err := nc.Subscribe(subj, func(m *nats.Msg) {
			mu.Lock()
			defer mu.Unlock()
			c.Msgs++
			c.Bytes += int64(len(m.Data))
			if c == &r.HB {
				var hb struct {
					Digest []uint64 `json:"prefix_digest"`
				}
				if json.Unmarshal(m.Data, &hb) == nil {
					r.DigestHashes = max(r.DigestHashes, len(hb.Digest))
				}
			}
		}); err != nil {
			fmt.Fprintln(os.Stderr, "natsbytes:", err)
			return 1
		}
	}
	if err := nc.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "natsbytes:", err)
		return 1
	}
	start := time.Now()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	mu.Lock()
	r.Seconds = time.Since(start).Seconds()
	data, _ := json.MarshalIndent(r, "", "  ")
	mu.Unlock()
	if *out == "" {
		fmt.Println(string(data))
		return 0
	}
	if err := os.WriteFile(*out, append(data, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "natsbytes:", err)
		return 1
	}
	return 0
}
