package workerrun

import (
	"errors"
	"testing"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/decode"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// TestDecodeHostTierDefault: the auto host tier is off on a decode worker
// of role decode only; a colocated worker and a size asked for keep theirs.
func TestDecodeHostTierDefault(t *testing.T) {
	for _, tc := range []struct {
		role      control.Role
		asked     int64
		wantBytes int64
	}{
		{control.RoleDecode, prefixcache.Auto, 0},
		{control.RoleColocated, prefixcache.Auto, prefixcache.Auto},
		{control.RoleDecode, 1 << 30, 1 << 30},
		{control.RoleDecode, 0, 0},
	} {
		o := decode.DefaultOptions()
		o.PrefixCache.HostBytes = tc.asked
		if got := decodeHostTier(tc.role, o, zap.NewNop()).PrefixCache.HostBytes; got != tc.wantBytes {
			t.Errorf("%s, host-cache-bytes %d: %d, want %d", tc.role, tc.asked, got, tc.wantBytes)
		}
	}
}

// TestSizeHostTier: an auto host tier is AutoHostBytes's size;
// where the free memory cannot be read (no /proc, as under a bare chroot)
// the worker has no host tier instead of failing to start; a size asked
// for, 0, and a cache that is off are left alone.
func TestSizeHostTier(t *testing.T) {
	gib := func() (int64, error) { return 2 << 30, nil }
	unknown := func() (int64, error) { return 0, errors.New("no /proc/meminfo") }
	for _, tc := range []struct {
		name      string
		asked     int64
		cacheOff  bool
		free      func() (int64, error)
		wantBytes int64
	}{
		{"auto", prefixcache.Auto, false, gib, 2 << 30},
		{"auto, free memory unknown", prefixcache.Auto, false, unknown, 0},
		{"asked", 1 << 20, false, unknown, 1 << 20},
		{"off", 0, false, gib, 0},
		{"cache off", prefixcache.Auto, true, gib, prefixcache.Auto},
	} {
		o := prefixcache.DefaultOptions()
		o.HostBytes = tc.asked
		if tc.cacheOff {
			o.MaxTokens = 0
		}
		if got := sizeHostTier(o, tc.free, zap.NewNop()).HostBytes; got != tc.wantBytes {
			t.Errorf("%s: host-cache-bytes %d, want %d", tc.name, got, tc.wantBytes)
		}
	}
	o := prefixcache.DefaultOptions()
	o.MaxTokens = 64
	if _, err := prefixcache.New(sizeHostTier(o, unknown, zap.NewNop())); err != nil {
		t.Errorf("a cache with the free memory unknown: %v, want one without a host tier", err)
	}
}
