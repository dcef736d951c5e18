package grpcnet

import (
	"testing"
	"time"
)

func TestKeepaliveOptions(t *testing.T) {
	for _, tc := range []struct {
		name          string
		o             KeepaliveOptions
		time, timeout time.Duration // of the client parameters
	}{
		{"defaults", KeepaliveOptions{}, DefaultKeepaliveTime, DefaultKeepaliveTimeout},
		{"longer", KeepaliveOptions{Time: time.Minute, Timeout: 20 * time.Second}, time.Minute, 20 * time.Second},
		{"under gRPC's client minimum", KeepaliveOptions{Time: 2 * time.Second, Timeout: time.Second}, 10 * time.Second, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.o.ClientParameters()
			if p.Time != tc.time || p.Timeout != tc.timeout || !p.PermitWithoutStream {
				t.Errorf("ClientParameters %+v, want time %v, timeout %v, pings without streams", p, tc.time, tc.timeout)
			}
			if err := tc.o.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
	if err := (KeepaliveOptions{Timeout: -time.Second}).Validate(); err == nil {
		t.Error("a negative timeout validated")
	}
}
