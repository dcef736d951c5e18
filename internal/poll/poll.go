// Package poll holds polling helpers shared by the packages' tests,
// so that a test waits for a condition instead of sleeping a fixed time.
package poll

import (
	"testing"
	"time"
)

// WaitFor polls cond every 2 ms until it holds, and fails the test when it
// still does not after 10 s. what names the condition in the failure.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// CheckFor calls f every `every` until it returns nil, and fails the test
// with f's last error once total has passed.
func CheckFor(t testing.TB, total, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", total, err)
		}
		time.Sleep(every)
	}
}
