package coordinatorrun

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// secrets writes one set of credentials per worker: each worker's
// certificate proves its own role and id and no other's, each NATS user is
// bound to its worker's id with only a hash in the users file, and every
// private file is unreadable to others. It never overwrites.
func TestSecrets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	var out strings.Builder
	if code := Secrets([]string{"--dir", dir, "--prefill", "prefill-0,prefill-1", "--decode", "decode-0"}, &out, &out); code != 0 {
		t.Fatalf("secrets: exit %d: %s", code, out.String())
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("dir: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	for _, name := range []string{"ca.key", "coordinator.key", "prefill-0.key", "decode-0.pw", "nats-users.yaml", "grpc-signing.pem", "kv-hash.key"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", name, err, fi.Mode().Perm())
		}
	}

	roots := x509.NewCertPool()
	roots.AddCert(readCert(t, filepath.Join(dir, "ca.crt")))
	workers := map[string]string{"prefill-0": "prefill", "prefill-1": "prefill", "decode-0": "decode"}
	templates := []string{"spiffe://pdserve/{role}/{id}"}
	for id, role := range workers {
		c := readCert(t, filepath.Join(dir, id+".crt"))
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: SecretsServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("%s: not a server certificate for %s under the CA: %v", id, SecretsServerName, err)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s: not a client certificate under the CA: %v", id, err)
		}
		if _, err := grpcauth.WorkerIdentity(c, templates, role, id); err != nil {
			t.Errorf("%s: the coordinator's check of its own id: %v", id, err)
		}
		for other, orole := range workers {
			if other == id {
				continue
			}
			if name, err := grpcauth.WorkerIdentity(c, templates, orole, other); err == nil {
				t.Errorf("%s's certificate passes for %s %s (as %s)", id, orole, other, name)
			}
		}
	}
	coord := readCert(t, filepath.Join(dir, "coordinator.crt"))
	if _, err := grpcauth.WorkerIdentity(coord, []string{"spiffe://pdserve/{role}", "spiffe://pdserve/{role}/{id}"}, "prefill", "prefill-0"); err == nil {
		t.Error("the coordinator's certificate passes for a prefill worker")
	}

	users, err := control.LoadUsers(filepath.Join(dir, "nats-users.yaml"))
	if err != nil {
		t.Fatalf("users file: %v", err)
	}
	if len(users) != len(workers) {
		t.Fatalf("users file has %d users, want %d", len(users), len(workers))
	}
	for _, u := range users {
		if u.ID != u.User || string(u.Role) != workers[u.User] {
			t.Errorf("user %s: role %q id %q, want %q bound to its own id", u.User, u.Role, u.ID, workers[u.User])
		}
		pw, err := os.ReadFile(filepath.Join(dir, u.User+".pw"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(u.Password, strings.TrimSpace(string(pw))) {
			t.Errorf("user %s: the users file holds the password itself", u.User)
		}
		if err := bcrypt.CompareHashAndPassword([]byte(u.Password), []byte(strings.TrimSpace(string(pw)))); err != nil {
			t.Errorf("user %s: its password file does not match its hash: %v", u.User, err)
		}
	}
	if _, err := kv.LoadHashKey(filepath.Join(dir, "kv-hash.key")); err != nil {
		t.Errorf("kv hash key: %v", err)
	}
	if err := (grpcauth.Options{SigningKeyFile: filepath.Join(dir, "grpc-signing.pem")}).Validate(grpcauth.RoleCoordinator); err != nil {
		t.Errorf("signing key: %v", err)
	}
	for _, want := range []string{"--tls-server-name " + SecretsServerName, "prefill-worker --id prefill-0 --nats-user prefill-0", "decode-worker --id decode-0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}

	before, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	out.Reset()
	if code := Secrets([]string{"--dir", dir, "--decode", "decode-9"}, &out, &out); code != 1 || !strings.Contains(out.String(), "not overwriting") {
		t.Errorf("secrets into a used dir: exit %d, %q", code, out.String())
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ca.crt")); string(after) != string(before) {
		t.Error("secrets into a used dir changed its CA")
	}
	if _, err := os.Stat(filepath.Join(dir, "decode-9.pw")); err == nil {
		t.Error("secrets into a used dir wrote a new worker's password")
	}
}

func TestSecretsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{},                                     // no workers
		{"--decode", "../etc"},                 // id naming a path
		{"--prefill", "w", "--decode", "w"},    // one id, two roles
		{"--decode", "d", "--validity", "-1h"}, // no validity
		{"--decode", "d", "extra"},             // stray argument
		{"--decode", "d", "--prefill", "a b"},  // space
		{"--decode", strings.Repeat("x", 64)},  // too long
	} {
		var out strings.Builder
		dir := filepath.Join(t.TempDir(), "s")
		if code := Secrets(append([]string{"--dir", dir}, args...), &out, &out); code != 2 {
			t.Errorf("secrets %q: exit %d, want 2: %s", args, code, out.String())
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("secrets %q made its directory", args)
		}
	}
}
