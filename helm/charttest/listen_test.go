package charttest

import (
	"flag"
	"net"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

// listenFlags names, per pdserve container of the chart, the flags that
// open a listener the pod must serve on its pod IP: the coordinator's
// HTTP port (API, probes, /metrics), a worker's gRPC port and its
// metrics port (probes, /metrics). The chart passes each explicitly on
// all interfaces, so that a binary whose default is loopback still
// serves its Service, its peers and the kubelet's probes.
var listenFlags = map[string][]string{
	"coordinator":    {"http-addr"},
	"prefill-worker": {"grpc-addr", "metrics-addr"},
	"decode-worker":  {"grpc-addr", "metrics-addr"},
}

// idleListenFlags are listen flags that open no listener in the chart's
// pods, with the flag whose presence keeps them idle: the coordinator runs
// an embedded NATS server on --nats-listen only without --nats-url, and
// the chart always gives --nats-url (the bundled or an external server).
var idleListenFlags = map[string]map[string]string{
	"coordinator": {"nats-listen": "nats-url"},
}

// listenUsage matches the usage text of a flag that sets a listen address.
var listenUsage = regexp.MustCompile(`(?i)\blisten(s|ing)? (address|on)\b`)

// TestListenFlagsKnown: listenFlags and idleListenFlags hold every flag of
// each binary whose usage says it sets a listen address, so that a
// listener added to a binary fails here until the chart sets it.
func TestListenFlagsKnown(t *testing.T) {
	for name, newFlags := range binaries {
		fs, _ := newFlags()
		var got []string
		fs.VisitAll(func(f *flag.Flag) {
			if listenUsage.MatchString(f.Usage) && !strings.HasPrefix(f.Name, "advertise-") {
				got = append(got, f.Name)
			}
		})
		want := slices.Clone(listenFlags[name])
		for f := range idleListenFlags[name] {
			want = append(want, f)
		}
		sort.Strings(got)
		sort.Strings(want)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: listen flags (-listenFlags +the binary's):\n%s", name, diff)
		}
	}
}

// checkListen: every pdserve container names each of its listen flags in
// its args, with a host that listens on all interfaces ("" or an
// unspecified address) and the port of the matching container port; an
// idle listen flag is idle (its condition flag is given, non-empty).
func checkListen(t *testing.T, r release) {
	ports := map[string]string{"http-addr": "http", "grpc-addr": "grpc", "metrics-addr": "metrics"}
	for name, spec := range r.podSpecs() {
		for _, c := range spec.Containers {
			want, ok := listenFlags[c.Name]
			if !ok {
				continue // nats (checked in TestNATSAuth), the helm test pod
			}
			where := name + "/" + c.Name
			args, err := expandArgs(c)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			given := map[string]string{}
			for _, a := range args {
				if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok && strings.HasPrefix(a, "--") {
					given[k] = v
				}
			}
			for _, f := range want {
				addr, ok := given[f]
				if !ok {
					t.Errorf("%s: no --%s in its args: the binary's default address would apply", where, f)
					continue
				}
				host, port, err := net.SplitHostPort(addr)
				if err != nil {
					t.Errorf("%s: --%s=%s: %v", where, f, addr, err)
					continue
				}
				if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
					t.Errorf("%s: --%s=%s listens on %s only, want all interfaces (:port or 0.0.0.0:port)", where, f, addr, host)
				}
				if p := containerPort(c, ports[f]); p == 0 || port != strconv.Itoa(int(p)) {
					t.Errorf("%s: --%s=%s, but container port %s is %d", where, f, addr, ports[f], p)
				}
			}
			for f, cond := range idleListenFlags[c.Name] {
				if _, set := given[f]; set {
					continue
				}
				if given[cond] == "" {
					t.Errorf("%s: neither --%s nor --%s: the embedded server would listen on the binary's default", where, f, cond)
				}
			}
		}
	}
}

// checkNATSListen: the bundled NATS server listens for clients on port
// 4222 and serves its monitoring (the probes) on 8222, on all
// interfaces, as the container's ports say.
func checkNATSListen(t *testing.T, c corev1.Container, host string, port int, httpHost string, httpPort int) {
	t.Helper()
	for _, l := range []struct {
		what, host, port string
		got              int
	}{{"client", host, "client", port}, {"monitor", httpHost, "monitor", httpPort}} {
		if ip := net.ParseIP(l.host); l.host != "" && (ip == nil || !ip.IsUnspecified()) {
			t.Errorf("nats: %s listener on %s, want all interfaces", l.what, l.host)
		}
		if want := containerPort(c, l.port); int(want) != l.got {
			t.Errorf("nats: %s listener on port %d, container port %s is %d", l.what, l.got, l.port, want)
		}
	}
}
