package k8se2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/repotest"
)

// docMarker precedes each shell block of docs/kubernetes.md that the e2e
// runs; readmetest reads it as a skipped recipe (the e2e, not readmetest,
// runs it).
var docMarker = regexp.MustCompile(`^<!-- recipe: skip \(make k8s-e2e runs it: ([a-z0-9-]+)\) -->$`)

// TestDocCommands: the commands docs/kubernetes.md shows for the e2e
// cluster are exactly those the e2e runs (docCommands), block by block,
// and every one of docCommands is shown. It needs no cluster.
func TestDocCommands(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repotest.Root(t), "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	got := map[string]string{}
	for i := 0; i < len(lines); i++ {
		m := docMarker.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		if i+1 >= len(lines) || lines[i+1] != "```sh" {
			t.Fatalf("docs/kubernetes.md:%d: marker %s not followed by a ```sh fence", i+1, m[1])
		}
		var block []string
		for i += 2; i < len(lines) && lines[i] != "```"; i++ {
			block = append(block, lines[i])
		}
		if _, dup := got[m[1]]; dup {
			t.Errorf("docs/kubernetes.md: block %s twice", m[1])
		}
		got[m[1]] = strings.Join(block, "\n")
	}
	if diff := cmp.Diff(docCommands, got); diff != "" {
		t.Errorf("docs/kubernetes.md's e2e blocks differ from docCommands (-e2e +docs):\n%s", diff)
	}
	if len(got) == 0 {
		t.Error("docs/kubernetes.md has no block the e2e runs")
	}
}
