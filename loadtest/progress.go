package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress draws a progress bar on a terminal; it is silent when the
// writer is not a terminal or when quiet. Safe for concurrent use.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	title string
	start time.Time
	last  time.Time
	drawn bool
	now   func() time.Time // time.Now; tests replace it
}

// isTerminal reports whether w is a character device (a TTY).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func newProgress(w io.Writer, quiet bool, title string) *progress {
	if quiet || !isTerminal(w) {
		return &progress{}
	}
	return &progress{w: w, title: title, start: time.Now(), now: time.Now}
}

// update redraws the bar at most ten times a second, and at the end.
func (p *progress) update(done, total int) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if done < total && now.Sub(p.last) < 100*time.Millisecond {
		return
	}
	p.last = now
	const width = 30
	fill := 0
	if total > 0 {
		fill = width * done / total
	}
	el := now.Sub(p.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(done) / el
	}
	fmt.Fprintf(p.w, "\r%s [%s%s] %d/%d %.1fs %.2f req/s ", p.title, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), done, total, el, rate)
	p.drawn = true
}

// finish ends the bar's line.
func (p *progress) finish() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}
