//go:build !linux

package frontend

import (
	"syscall"
	"time"
)

// socketRTT is not measured off Linux: the budget has no client_rtt_ms.
func socketRTT(syscall.RawConn) (time.Duration, bool) { return 0, false }
