package frontend

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// socketRTT reads the smoothed RTT of a TCP socket (TCP_INFO's tcpi_rtt,
// in microseconds).
func socketRTT(rc syscall.RawConn) (time.Duration, bool) {
	var info *unix.TCPInfo
	var serr error
	if err := rc.Control(func(fd uintptr) {
		info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || serr != nil {
		return 0, false
	}
	return time.Duration(info.Rtt) * time.Microsecond, true
}
