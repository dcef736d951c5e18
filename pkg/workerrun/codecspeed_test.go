package workerrun

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
)

// A decode worker benchmarks its codecs and publishes the figures in its
// heartbeats; a prefill worker, with the NATS permissions of its role,
// reads them and has the receiver's decode speed per codec by address.
func TestReceiverCodecSpeedsReachPrefill(t *testing.T) {
	du := control.NewNATSUser(control.RoleDecode, "decode-0")
	pu := control.NewNATSUser(control.RolePrefill, "prefill-0")
	s, url, err := control.StartEmbedded("127.0.0.1:-1", control.WithUsers([]control.NATSUser{du, pu}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })

	do := testOptions(control.RoleDecode, url)
	do.ID, do.NATS = "decode-0", passwordFile(t, du)
	d := startWorker(t, do)
	po := testOptions(control.RolePrefill, url)
	po.ID, po.NATS = "prefill-0", passwordFile(t, pu)
	p := startWorker(t, po)
	if p.cur().receivers == nil {
		t.Fatal("prefill worker watches no receivers")
	}
	poll.CheckFor(t, 60*time.Second, 5*time.Millisecond, func() error {
		r, ok := receiverSpeeds(p.cur().receivers, d.Addr())
		if !ok {
			return errors.New("no codec speeds of the decode worker yet")
		}
		if r.Cores <= 0 {
			return fmt.Errorf("receiver cores %d", r.Cores)
		}
		for _, name := range []string{"none", "s2", "zstd", "bf16", "fp8", "int8"} {
			if v := r.DecodeBytesPerSec[name]; !(v > 0) {
				return fmt.Errorf("decode speed of %s: %v", name, v)
			}
		}
		return nil
	})
	if _, ok := receiverSpeeds(p.cur().receivers, "10.0.0.1:1"); ok {
		t.Error("speeds for an address no worker has")
	}
	if d.cur().receivers != nil {
		t.Error("a decode worker watches receivers")
	}
}
