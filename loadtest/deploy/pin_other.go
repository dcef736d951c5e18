//go:build !linux

package deploy

import (
	"errors"
	"os/exec"
)

// startPinned needs Linux's sched_setaffinity.
func startPinned(*exec.Cmd, []int) error {
	return errors.New("pinning workers to cores needs Linux")
}
