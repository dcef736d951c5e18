// Package repotest finds the repository's own files from tests: the module
// root (the directory holding go.mod), the traces shipped under data/, and
// the project's shared data beside it (../shared/data), which a checkout may
// lack.
package repotest

import (
	"os"
	"path/filepath"
	"testing"
)

// Root returns the module root above the test's working directory, or fails
// the test.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("repotest: no go.mod above the test's directory")
		}
		dir = parent
	}
}

// Traces returns the directory of the traces shipped with the repository
// (data/ under the module root: azure-llm-2023, mooncake-fast25), or fails
// the test when it is missing.
func Traces(t testing.TB) string {
	t.Helper()
	d := filepath.Join(Root(t), "data")
	if _, err := os.Stat(filepath.Join(d, "azure-llm-2023")); err != nil {
		t.Fatalf("repotest: the shipped traces are missing: %v", err)
	}
	return d
}

// SharedData returns the project's shared data directory (../shared/data
// from the module root), or skips the test with the reason when it is
// absent.
func SharedData(t testing.TB) string {
	t.Helper()
	d := filepath.Join(Root(t), "..", "shared", "data")
	if _, err := os.Stat(d); err != nil {
		t.Skipf("shared data absent next to the repository (%v): comparison with it skipped", err)
	}
	return d
}

// Llama returns the directories of the llama.cpp libraries and vocab GGUFs
// that `make llama` installs (third_party/llama/lib and .../vocab). When
// they are missing the test fails under CI=true, where a missing dependency
// must never pass silently, and is skipped with the command to run
// otherwise.
func Llama(t testing.TB) (libDir, vocabDir string) {
	t.Helper()
	root := Root(t)
	libDir = filepath.Join(root, "third_party", "llama", "lib")
	vocabDir = filepath.Join(root, "third_party", "llama", "vocab")
	for _, d := range []string{libDir, vocabDir} {
		if _, err := os.Stat(d); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("llama.cpp is not installed (%v): CI must run `make llama` before the tests", err)
			}
			t.Skipf("llama.cpp is not installed (%v): run `make llama`", err)
		}
	}
	return libDir, vocabDir
}
