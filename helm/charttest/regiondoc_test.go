package charttest

import (
	"bufio"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

const regionsDoc = "../../docs/regions.md"

// docValuesRE is the line that introduces a region's values block in
// docs/regions.md: "`us-east-values.yaml`:" (or "…, the mirror image:").
var docValuesRE = regexp.MustCompile("^`([a-z0-9-]+)-values\\.yaml`[^`]*:$")

// TestRegionDocValues: the two-region install of docs/regions.md is the
// one the chart tests render. Each region's values block in the doc is
// its values file (comments aside); each region's peer is the other
// region by its name; each region's certificate, as step 1 makes it,
// names the host of its advertise URL (which the other coordinator dials
// to forward) and the host the other region's gateway dials it at, and
// serves both ends; and each release's region.tlsSecret is the Secret
// the doc creates, with the three keys the chart mounts. It fails when
// the doc and the files drift apart (a host, a peer, a Secret renamed on
// one side only).
func TestRegionDocValues(t *testing.T) {
	b, err := os.ReadFile(regionsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)

	// The values blocks, by region.
	blocks := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(doc))
	for region := ""; sc.Scan(); {
		line := sc.Text()
		switch {
		case region != "" && line == "```yaml":
			var lines []string
			for sc.Scan() && sc.Text() != "```" {
				lines = append(lines, sc.Text())
			}
			blocks[region] = strings.Join(lines, "\n") + "\n"
			region = ""
		case docValuesRE.MatchString(line):
			region = docValuesRE.FindStringSubmatch(line)[1]
		}
	}
	values := map[string]map[string]any{}
	for region, file := range regionFiles {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var kept []string
		for _, l := range strings.SplitAfter(string(b), "\n") {
			if !strings.HasPrefix(l, "#") && l != "" {
				kept = append(kept, l)
			}
		}
		if diff := cmp.Diff(strings.Join(kept, ""), blocks[region]); diff != "" {
			t.Errorf("%s: %s's values block differs from %s (-file +doc):\n%s", region, regionsDoc, file, diff)
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		values[region] = v
	}
	if len(blocks) != len(regionFiles) {
		t.Errorf("%s has values blocks for %d regions, want %d", regionsDoc, len(blocks), len(regionFiles))
	}

	// Step 1's certificates: subjectAltName with %s for the region.
	san := regexp.MustCompile(`subjectAltName=([^\\']+)\\nextendedKeyUsage=([^\\']+)`).FindStringSubmatch(doc)
	if san == nil {
		t.Fatalf("%s: no openssl subjectAltName/extendedKeyUsage for the region certificates", regionsDoc)
	}
	if eku := strings.Split(san[2], ","); !slices.Contains(eku, "serverAuth") || !slices.Contains(eku, "clientAuth") {
		t.Errorf("region certificates' extendedKeyUsage %q: each side dials and accepts, want serverAuth and clientAuth", san[2])
	}
	dnsNames := func(region string) []string {
		var out []string
		for _, n := range strings.Split(san[1], ",") {
			out = append(out, strings.ReplaceAll(strings.TrimPrefix(n, "DNS:"), "%s", region))
		}
		return out
	}
	secret := regexp.MustCompile(`create secret generic (\S+) --type=kubernetes.io/tls\s+\\?\s*--from-file=tls\.crt=\S+ --from-file=tls\.key=\S+ --from-file=ca\.crt=\S+`).FindStringSubmatch(doc)
	if secret == nil {
		t.Fatalf("%s: no kubectl create secret with tls.crt, tls.key and ca.crt", regionsDoc)
	}

	str := func(v any) string { s, _ := v.(string); return s }
	for region, v := range values {
		r, _ := v["region"].(map[string]any)
		if str(r["name"]) != region {
			t.Errorf("%s: region.name %q", region, r["name"])
		}
		if str(r["tlsSecret"]) != secret[1] {
			t.Errorf("%s: region.tlsSecret %q, the doc creates %q", region, r["tlsSecret"], secret[1])
		}
		adv, err := url.Parse(str(r["advertiseURL"]))
		if err != nil || adv.Scheme != "https" || !slices.Contains(dnsNames(region), adv.Hostname()) {
			t.Errorf("%s: advertiseURL %q: want https at a host of its certificate %v", region, r["advertiseURL"], dnsNames(region))
		}
		gw, _ := r["gateway"].(map[string]any)
		peers, _ := gw["peers"].([]any)
		var names []string
		for _, p := range peers {
			p, _ := p.(map[string]any)
			peer := str(p["name"])
			names = append(names, peer)
			u, err := url.Parse(str(p["url"]))
			if err != nil || u.Scheme != "nats" || u.Port() == "" || !slices.Contains(dnsNames(peer), u.Hostname()) {
				t.Errorf("%s: peer %s at %q: want nats://HOST:PORT at a host of %s's certificate %v", region, peer, p["url"], peer, dnsNames(peer))
			}
		}
		var others []string
		for o := range values {
			if o != region {
				others = append(others, o)
			}
		}
		if !cmp.Equal(names, others) {
			t.Errorf("%s: peers %v, want the other regions %v", region, names, others)
		}
	}
}
