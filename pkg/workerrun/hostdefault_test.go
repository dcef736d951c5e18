package workerrun

import (
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
