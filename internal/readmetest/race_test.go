//go:build race

package readmetest

// raceBuild: the test runs with -race, and builds the binaries with it too,
// so that they reuse what `go test -race ./...` compiled.
const raceBuild = true
