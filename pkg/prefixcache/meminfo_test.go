package prefixcache

import (
	"strings"
	"testing"
)

func TestMemAvailable(t *testing.T) {
	got, err := memAvailable([]byte("MemTotal:       16384 kB\nMemFree:         1024 kB\nMemAvailable:    8192 kB\n"))
	if err != nil || got != 8192<<10 {
		t.Errorf("memAvailable = %d, %v; want %d", got, err, 8192<<10)
	}
	for _, bad := range []string{"MemTotal: 16384 kB\n", "MemAvailable: x kB\n"} {
		if _, err := memAvailable([]byte(bad)); err == nil {
			t.Errorf("memAvailable(%q): no error", bad)
		}
	}
}

func TestHostOptions(t *testing.T) {
	o := DefaultOptions()
	if o.HostBytes != Auto {
		t.Errorf("default HostBytes %d, want Auto", o.HostBytes)
	}
	o.MaxTokens = 64
	o.HostBytes = -2
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "host-cache-bytes -2") {
		t.Errorf("Validate(host-cache-bytes -2) = %v", err)
	}
	o.HostBytes = 0
	c, err := New(o)
	if err != nil || c.Host() != nil || c.HostDeeper(nil, 1, nil) {
		t.Errorf("HostBytes 0: host tier %v, %v; want none", c.Host(), err)
	}
	o.HostBytes = 1 << 20
	if c, err = New(o); err != nil || c.Host().Budget() != 1<<20 {
		t.Errorf("HostBytes 1 MiB: budget %d, %v", c.Host().Budget(), err)
	}
	if _, err := MemAvailable(); err == nil {
		o.HostBytes = Auto
		if c, err = New(o); err != nil || c.Host().Budget() <= 0 {
			t.Errorf("HostBytes Auto: budget %d, %v", c.Host().Budget(), err)
		}
	}
}
