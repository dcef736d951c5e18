// Command coredns is CoreDNS with the plugins of the lab's Corefile
// (internal/k8slab/cluster.go) and no others, in the way CoreDNS documents
// for a build of chosen plugins: a main that imports them and
// coremain. Upstream's main imports every plugin (core/plugin), which
// brings in the clients of three clouds' DNS APIs: building those took
// most of CoreDNS's 221 s in a cold .ci/run. A Corefile directive whose
// plugin is not imported here fails at start with "unknown directive",
// so the lab's k8s-up says at once when the Corefile grows.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The Corefile's plugins (prometheus is plugin/metrics); they run in
	// CoreDNS's order (dnsserver.Directives), not this one.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
