package apikey

import (
	"context"
	"os"
	"time"

	"go.uber.org/zap"
)

// Reloadable is a file Watch reloads: *Keys and *Token.
type Reloadable interface {
	Path() string
	// Reload rereads the file; ReloadIfChanged only when it changed.
	// Both report whether the contents were replaced; on error the old
	// contents stay.
	Reload() (bool, error)
	ReloadIfChanged() (bool, error)
}

var (
	_ Reloadable = (*Keys)(nil)
	_ Reloadable = (*Token)(nil)
)

// Watch reloads files until ctx ends: on each tick those that changed
// (ReloadIfChanged), on each value of force all of them (Reload; the
// coordinator sends SIGHUP there). Either channel may be nil, and one
// that is closed is ignored from then on. Each reload is logged at info
// with the file's path and trigger (and the number of keys of a *Keys, at
// warn when there are none: every request is refused), each failure at
// error with its cause, which holds no secret, and reported to failed
// (nil: not reported); the old contents stay. It returns when ctx ends.
func Watch(ctx context.Context, tick <-chan time.Time, force <-chan os.Signal, log *zap.Logger, failed func(), files ...Reloadable) {
	if log == nil {
		log = zap.NewNop()
	}
	if failed == nil {
		failed = func() {}
	}
	run := func(trigger string, forced bool) {
		for _, f := range files {
			reload := f.ReloadIfChanged
			if forced {
				reload = f.Reload
			}
			changed, err := reload()
			switch {
			case err != nil:
				failed()
				log.Error("reload failed; the old contents stay in use", zap.String("file", f.Path()), zap.String("trigger", trigger), zap.Error(err))
			case changed:
				fields := []zap.Field{zap.String("file", f.Path()), zap.String("trigger", trigger)}
				if k, ok := f.(*Keys); ok {
					fields = append(fields, zap.Int("keys", k.Len()))
					if k.Len() == 0 {
						log.Warn("reloaded a key file without keys: every key is revoked, every request refused", fields...)
						continue
					}
				}
				log.Info("reloaded", fields...)
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-tick:
			if !ok {
				tick = nil
				continue
			}
			run("change", false)
		case s, ok := <-force:
			if !ok {
				force = nil
				continue
			}
			trigger := "signal"
			if s != nil {
				trigger = s.String()
			}
			run(trigger, true)
		}
	}
}
