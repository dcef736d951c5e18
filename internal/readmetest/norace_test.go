//go:build !race

package readmetest

// raceBuild: the test runs without -race, and builds the binaries without.
const raceBuild = false
