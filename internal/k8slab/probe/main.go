// Command probe is the lab's smoke-test image: a static binary with two
// modes.
//
//	probe serve [--addr :8080]      answer GET / with the pod's host name
//	probe get URL [--want-ip IP]    resolve URL's host (the pod's
//	                                resolv.conf, i.e. cluster DNS), GET it and
//	                                print one JSON line; retries for 60 s
//
// get exits 0 when the GET answered 200 (and, with --want-ip, the host
// resolved to that address), 1 otherwise.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: probe serve|get …")
		return 2
	}
	switch args[0] {
	case "serve":
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		addr := fs.String("addr", ":8080", "listen address")
		if fs.Parse(args[1:]) != nil {
			return 2
		}
		host, _ := os.Hostname()
		http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, host) })
		fmt.Fprintln(os.Stderr, "probe: serving on", *addr)
		if err := http.ListenAndServe(*addr, nil); err != nil {
			fmt.Fprintln(os.Stderr, "probe:", err)
			return 1
		}
		return 0
	case "get":
		fs := flag.NewFlagSet("get", flag.ContinueOnError)
		wantIP := fs.String("want-ip", "", "address the host must resolve to")
		if len(args) < 2 || fs.Parse(args[2:]) != nil {
			fmt.Fprintln(os.Stderr, "usage: probe get URL [--want-ip IP]")
			return 2
		}
		return get(args[1], *wantIP)
	}
	fmt.Fprintln(os.Stderr, "probe: unknown mode", args[0])
	return 2
}

type result struct {
	Host     string   `json:"host"`
	Resolved []string `json:"resolved"`
	Status   int      `json:"status"`
	Body     string   `json:"body"`
	Error    string   `json:"error,omitempty"`
	Tries    int      `json:"tries"`
}

func get(raw, wantIP string) int {
	u, err := url.Parse(raw)
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 2
	}
	var r result
	r.Host = u.Hostname()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r.Tries++
		r.Error = ""
		if err := once(u, wantIP, &r); err == nil {
			break
		} else {
			r.Error = err.Error()
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	if r.Error != "" {
		return 1
	}
	return 0
}

func once(u *url.URL, wantIP string, r *result) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, r.Host)
	if err != nil {
		return err
	}
	r.Resolved = addrs
	if wantIP != "" && !slices.Contains(addrs, wantIP) {
		return fmt.Errorf("%s resolved to %v, want %s", r.Host, addrs, wantIP)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	r.Status, r.Body = resp.StatusCode, strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return nil
}
