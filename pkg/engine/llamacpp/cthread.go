package llamacpp

import "runtime"

// cthread runs functions on one goroutine locked to its OS thread. Every
// llama_decode of an engine runs there: a llama.cpp built with OpenMP
// keeps one thread team per calling thread, spinning between calls, so
// calls from whichever thread the Go scheduler picks would leave several
// teams competing for the same cores (measured here: three threads busy
// on two cores, steps over twice as slow).
type cthread struct {
	work chan func()
	done chan struct{}
}

func startCThread() *cthread {
	c := &cthread{work: make(chan func()), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		for f := range c.work {
			f()
			c.done <- struct{}{}
		}
	}()
	return c
}

// do runs f on the thread and waits for it. Not safe for concurrent use
// (an engine makes one call at a time).
func (c *cthread) do(f func()) {
	c.work <- f
	<-c.done
}

// stop ends the thread's goroutine once its current call returns.
func (c *cthread) stop() { close(c.work) }
