// Command purego is a test program linked as pdserve's binaries are:
// CGO_ENABLED=0 with purego imported, which makes it a dynamically linked
// glibc program. It prints its user and group ids and tries to write to
// the root file system.
package main

import (
	"fmt"
	"os"

	_ "github.com/ebitengine/purego"
)

func main() {
	err := os.WriteFile("/written-by-test", []byte("x"), 0o644)
	fmt.Printf("uid=%d gid=%d root-writable=%v\n", os.Getuid(), os.Getgid(), err == nil)
}
