package deploy

import (
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// startPinned starts cmd with its CPU affinity set to cpus, inherited by
// every thread it makes: the fork happens on an OS thread locked to this
// goroutine whose mask is set first. That thread is never unlocked, so it
// exits with the goroutine and no other goroutine runs on the narrowed
// mask.
func startPinned(cmd *exec.Cmd, cpus []int) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		var set unix.CPUSet
		for _, c := range cpus {
			set.Set(c)
		}
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- fmt.Errorf("pin to cores %v: %w", cpus, err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}
