package netlab

import (
	"context"
	"errors"
	"os"
	"testing"
)

// NewForTest returns a Lab that is closed when t ends (t.Cleanup), and
// checks then that none of its namespaces is left. Where namespaces are
// not allowed it skips t with the reason, except when CI=true and the
// process runs as root: there the harness must work, and t fails.
func NewForTest(t testing.TB) *Lab {
	t.Helper()
	l, err := New(context.Background())
	if err != nil {
		if errors.Is(err, ErrUnsupported) && !(os.Getenv("CI") == "true" && os.Geteuid() == 0) {
			t.Skipf("netlab: skipped, network namespaces not allowed here: %v", err)
		}
		t.Fatalf("netlab: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("netlab: close: %v", err)
		}
		left, err := List(context.Background())
		if err != nil {
			t.Errorf("netlab: %v", err)
			return
		}
		mine := map[string]bool{}
		for _, n := range l.Namespaces() {
			mine[n] = true
		}
		for _, n := range left {
			if mine[n] {
				t.Errorf("netlab: namespace %s left after Close", n)
			}
		}
	})
	return l
}
