package coordinatorrun

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/grpcauth"
)

// SecretsServerName is the DNS name every worker certificate that
// `coordinator secrets` issues carries, and so the --tls-server-name its
// clients verify (workers are dialed by IP).
const SecretsServerName = "pdserve-worker"

// secretsTrustDomain is the SPIFFE trust domain of the identities
// `coordinator secrets` issues: the defaults of --tls-worker-identity.
const secretsTrustDomain = "spiffe://pdserve"

// workerIDPattern is what a worker id may be here: it names files and NATS
// users, so no path separators or spaces.
var workerIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Secrets is the secrets subcommand: it writes, into a new directory, every
// secret a deployment of processes started apart needs, each worker's its
// own:
//
//   - ca.crt (every process's --tls-ca) and ca.key (mode 0600: a
//     certificate for a worker added later is signed with it, e.g. by
//     openssl x509 -req -CA ca.crt -CAkey ca.key; keep it off the nodes);
//   - coordinator.crt/.key, naming spiffe://pdserve/coordinator;
//   - ID.crt/.key per worker, naming spiffe://pdserve/ROLE and
//     spiffe://pdserve/ROLE/ID and the DNS name pdserve-worker;
//   - ID.pw per worker (its --nats-password-file) and nats-users.yaml
//     (the coordinator's --nats-auth-file) holding their bcrypt hashes,
//     each user bound to its worker id;
//   - grpc-signing.pem and grpc-verify.pem (keygen's pair);
//   - kv-hash.key (every process's --kv-hash-key-file).
//
// Private files are mode 0600 in a 0700 directory; it refuses a directory
// that holds any of the files. It returns the exit code: 0, 1 when a file
// cannot be written, 2 for bad flags.
func Secrets(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("coordinator secrets", flag.ContinueOnError)
	dir := fs.String("dir", ".pdserve", "directory to write the files into (made with mode 0700; none of the files may exist)")
	var roles [3]idList
	fs.Var(&roles[0], "prefill", "prefill worker ids to issue credentials for (repeatable, comma-separated)")
	fs.Var(&roles[1], "decode", "decode worker ids (repeatable, comma-separated)")
	fs.Var(&roles[2], "colocated", "colocated worker ids (repeatable, comma-separated)")
	validity := fs.Duration("validity", 90*24*time.Hour, "how long the certificates are valid (the CA: twice that)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: coordinator secrets [--dir DIR] --prefill ID,... --decode ID,... [--colocated ID,...]\n\n"+
			"Writes the secrets of a deployment whose processes start apart, one set per worker:\n"+
			"a CA and a certificate per component for mutual TLS (the coordinator's names\n"+
			spiffeID("coordinator")+"; a worker's "+spiffeID("ROLE")+" and "+spiffeID("ROLE/ID")+",\n"+
			"and the DNS name "+SecretsServerName+" for --tls-server-name), a NATS user and password\n"+
			"per worker bound to its id (nats-users.yaml holds bcrypt hashes), the gRPC signing\n"+
			"key pair and the KV hash key. It prints the flags each process takes.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := cliflags.ParseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "coordinator secrets: unexpected arguments %q\n", fs.Args())
		return 2
	}
	workers := map[string]string{} // id → role
	for i, role := range []string{"prefill", "decode", "colocated"} {
		for _, id := range roles[i] {
			if prev, dup := workers[id]; dup {
				fmt.Fprintf(stderr, "coordinator secrets: worker id %q given twice (%s and %s)\n", id, prev, role)
				return 2
			}
			workers[id] = role
		}
	}
	if len(workers) == 0 {
		fmt.Fprintln(stderr, "coordinator secrets: name the workers: --prefill ID,... --decode ID,... (or --colocated)")
		return 2
	}
	if *validity <= 0 {
		fmt.Fprintln(stderr, "coordinator secrets: --validity must be positive")
		return 2
	}
	files, err := makeSecrets(workers, *validity)
	if err != nil {
		fmt.Fprintf(stderr, "coordinator secrets: %v\n", err)
		return 1
	}
	if err := writeSecrets(*dir, files); err != nil {
		fmt.Fprintf(stderr, "coordinator secrets: %v\n", err)
		return 1
	}
	writeSecretsUsage(stdout, filepath.Clean(*dir), workers)
	return 0
}

// idList is a repeatable, comma-separated flag of worker ids.
type idList []string

func (l *idList) String() string { return strings.Join(*l, ",") }

func (l *idList) Set(v string) error {
	for _, id := range strings.Split(v, ",") {
		id = strings.TrimSpace(id)
		if !workerIDPattern.MatchString(id) {
			return fmt.Errorf("worker id %q: want letters, digits, '.', '_' or '-', at most 63", id)
		}
		*l = append(*l, id)
	}
	return nil
}

func spiffeID(path string) string { return secretsTrustDomain + "/" + path }

// secretFile is one file to write.
type secretFile struct {
	name    string
	data    []byte
	private bool
}

// makeSecrets makes every file in memory, so that nothing is written when
// one fails.
func makeSecrets(workers map[string]string, validity time.Duration) ([]secretFile, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "pdserve CA"},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(2 * validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	caKeyPEM, err := pemKey(caKey)
	if err != nil {
		return nil, err
	}
	files := []secretFile{
		{name: "ca.crt", data: pemCert(caDER)},
		{name: "ca.key", data: caKeyPEM, private: true},
	}
	issue := func(name string, uris []string, dns []string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: randomSerial(),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    now.Add(-5 * time.Minute),
			NotAfter:     now.Add(validity),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:     dns,
		}
		for _, u := range uris {
			pu, err := url.Parse(u)
			if err != nil {
				return err
			}
			tmpl.URIs = append(tmpl.URIs, pu)
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyPEM, err := pemKey(key)
		if err != nil {
			return err
		}
		files = append(files, secretFile{name: name + ".crt", data: pemCert(der)},
			secretFile{name: name + ".key", data: keyPEM, private: true})
		return nil
	}
	if err := issue("coordinator", []string{spiffeID("coordinator")}, nil); err != nil {
		return nil, err
	}
	var users strings.Builder
	users.WriteString("# NATS users of the workers started apart, one per worker, bound to its id\n" +
		"# (coordinator --nats-auth-file). Passwords are bcrypt hashes; each worker\n" +
		"# reads its own from ID.pw (--nats-password-file).\nusers:\n")
	for _, id := range sortedIDs(workers) {
		role := workers[id]
		if err := issue(id, []string{spiffeID(role), spiffeID(role + "/" + id)}, []string{SecretsServerName}); err != nil {
			return nil, err
		}
		pw := randomHex(24)
		hash, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.DefaultCost)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&users, "  - {user: %s, password: %q, role: %s, id: %s}\n", id, hash, role, id)
		files = append(files, secretFile{name: id + ".pw", data: []byte(pw + "\n"), private: true})
	}
	files = append(files, secretFile{name: "nats-users.yaml", data: []byte(users.String()), private: true})
	priv, pub, err := grpcauth.GenerateKey()
	if err != nil {
		return nil, err
	}
	files = append(files,
		secretFile{name: "grpc-signing.pem", data: priv, private: true},
		secretFile{name: "grpc-verify.pem", data: pub},
		secretFile{name: "kv-hash.key", data: []byte(randomHex(32) + "\n"), private: true})
	return files, nil
}

// writeSecrets writes files into dir (made 0700 if missing); when one of
// them exists nothing is written, and when a write fails the files
// written so far are removed.
func writeSecrets(dir string, files []secretFile) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(dir, f.name)); err == nil {
			return fmt.Errorf("%s exists: not overwriting secrets (use a new --dir)", filepath.Join(dir, f.name))
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	var written []string
	for _, f := range files {
		perm := os.FileMode(0o644)
		if f.private {
			perm = 0o600
		}
		path := filepath.Join(dir, f.name)
		if err := writeNew(path, f.data, perm); err != nil {
			for _, w := range written {
				_ = os.Remove(w)
			}
			return err
		}
		written = append(written, path)
	}
	return nil
}

// writeSecretsUsage prints the flags each process takes.
func writeSecretsUsage(w io.Writer, dir string, workers map[string]string) {
	f := func(name string) string { return filepath.Join(dir, name) }
	tls := func(name string) string {
		return fmt.Sprintf("--tls-cert %s --tls-key %s --tls-ca %s --tls-server-name %s",
			f(name+".crt"), f(name+".key"), f("ca.crt"), SecretsServerName)
	}
	identity := "--tls-worker-identity '" + spiffeID("{role}/{id}") + "'"
	fmt.Fprintf(w, "wrote the secrets into %s; start the processes with:\n\n", dir)
	fmt.Fprintf(w, "coordinator --nats-auth-file %s --grpc-signing-key %s --kv-hash-key-file %s \\\n  %s %s\n",
		f("nats-users.yaml"), f("grpc-signing.pem"), f("kv-hash.key"), tls("coordinator"), identity)
	for _, id := range sortedIDs(workers) {
		role := workers[id]
		// Every worker takes KV calls from prefill workers only (pushes
		// to a decode worker, peer pulls from a prefill worker); a prefill
		// worker checks its decode peers' ids as the coordinator does.
		allow := "--tls-allow-coordinator " + spiffeID("coordinator") + " --tls-allow-prefill " + spiffeID("prefill")
		if role == "prefill" {
			allow += " " + identity
		}
		fmt.Fprintf(w, "%s-worker --id %s --nats-user %s --nats-password-file %s --grpc-verify-key %s --kv-hash-key-file %s \\\n  %s %s\n",
			role, id, id, f(id+".pw"), f("grpc-verify.pem"), f("kv-hash.key"), tls(id), allow)
	}
}

func sortedIDs(workers map[string]string) []string {
	ids := make([]string, 0, len(workers))
	for id := range workers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func pemKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func randomSerial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127)) // crypto/rand never fails
	return n.Add(n, big.NewInt(1))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
