// Package readmetest runs the README's recipes: every shell block of
// README.md and docs/*.md is marked, on the line before its fence, as
//
//	<!-- recipe -->                  run it
//	<!-- recipe: continued -->       run it with the servers of the recipe above still up
//	<!-- recipe: skip (REASON) -->   not run in CI, for the reason given
//
// and the test (readme_test.go) runs the recipes, one at a time,
// against the binaries built once into a temporary directory (with -race
// under -race): `go run ./cmd/X` and `go run ./loadtest` become those
// binaries, `go tool NAME` of a go.mod tool the binary built from the
// package go.mod names (so it reuses the packages the tests compiled; a
// recipe waits for its tool, the others run while it builds), every
// 127.0.0.1 or localhost port a free one that no other recipe was given,
// /tmp/ a directory of the test's own, their.gguf a random-weight
// tiny-llama GGUF written by cmd/mkgguf, and `make llama` a check that
// llama.cpp is installed. A recipe runs in a fresh directory whose entries
// link to the repository's, so that what it writes (.pdserve/) stays out of
// the tree. The coordinator and the workers run in the background, each in
// a process group of its own; the commands after them wait until every one
// answers /readyz, and the recipe ends with all of them stopped (SIGTERM,
// then SIGKILL) and their groups gone. The test also checks that relative
// links and #anchors in those files resolve.
//
// Under CI=true a missing dependency (llama.cpp libraries, curl, openssl)
// fails the test; elsewhere the recipes that need it are skipped with a
// message.
package readmetest
