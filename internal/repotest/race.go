//go:build race

package repotest

// Race is whether this binary was built with the race detector.
const Race = true
