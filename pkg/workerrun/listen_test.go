package workerrun

import "testing"

// TestDefaultsListenOnLoopback: a worker started without addresses is
// reachable from its own host only.
func TestDefaultsListenOnLoopback(t *testing.T) {
	for _, o := range []Options{NewPrefillOptions(), NewDecodeOptions()} {
		if !isLoopback(o.GRPCAddr) || !isLoopback(o.MetricsAddr) {
			t.Errorf("%s worker defaults: grpc-addr %q, metrics-addr %q; want loopback addresses", o.Role, o.GRPCAddr, o.MetricsAddr)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9000":        true,
		"127.8.0.1:9000":        true,
		"[::1]:9000":            true,
		"localhost:9000":        true,
		"LocalHost.:9000":       true,
		"worker.localhost:9000": true,
		":9000":                 false,
		"0.0.0.0:9000":          false,
		"10.0.0.7:9000":         false,
		"decode-0.pdserve:9000": false,
		"127.0.0.1":             false, // no port: not an address
	} {
		if got := isLoopback(addr); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestRemoteNATS(t *testing.T) {
	for urls, want := range map[string]string{
		"nats://127.0.0.1:4222":                       "",
		"nats://localhost:4222,tls://[::1]:4222":      "",
		"127.0.0.1:4222":                              "",
		"nats://user:pw@nats.pdserve:4222":            "nats.pdserve",
		"nats://127.0.0.1:4222, nats://10.0.0.2:4222": "10.0.0.2",
		"10.0.0.3:4222":                               "10.0.0.3",
		"":                                            "",
	} {
		if got := remoteNATS(urls); got != want {
			t.Errorf("remoteNATS(%q) = %q, want %q", urls, got, want)
		}
	}
}
