package coordinatorrun

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/pkg/grpcauth"
)

// keygen writes a pair the coordinator and the workers load; it never
// overwrites a key.
func TestKeygen(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "s.pem"), filepath.Join(dir, "v.pem")
	var out strings.Builder
	if code := Keygen([]string{"--private", priv, "--public", pub}, &out, &out); code != 0 {
		t.Fatalf("keygen: exit %d: %s", code, out.String())
	}
	if fi, err := os.Stat(priv); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("private key file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	if err := (grpcauth.Options{SigningKeyFile: priv}).Validate(grpcauth.RoleCoordinator); err != nil {
		t.Errorf("coordinator with the private key: %v", err)
	}
	if err := (grpcauth.Options{VerifyKeyFile: pub, Self: "decode-0"}).Validate(0); err != nil {
		t.Errorf("worker with the public key: %v", err)
	}
	out.Reset()
	if code := Keygen([]string{"--private", priv, "--public", filepath.Join(dir, "other.pem")}, &out, &out); code != 1 || !strings.Contains(out.String(), "not overwriting") {
		t.Errorf("keygen over an existing key: exit %d, %q", code, out.String())
	}
}
