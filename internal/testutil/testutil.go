// Package testutil holds helpers shared by the worker packages' tests.
package testutil

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
