package apikey

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"sync/atomic"
)

// Token is a bearer token read from a file, such as the one that guards
// /metrics. The file holds the token itself (as a Prometheus
// credentials_file does), surrounding whitespace ignored: at least
// MinKeyLen bytes of printable ASCII without spaces. Only its SHA-256 is
// kept. Safe for concurrent use.
type Token struct {
	file   watched
	digest atomic.Pointer[[sha256.Size]byte]
}

// LoadToken reads the token file at path. Errors: the file's, and an
// invalid token (wrapping ErrInvalid; never holding the token).
func LoadToken(path string) (*Token, error) {
	t := &Token{file: watched{path: path}}
	if _, err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Path returns the token file's path.
func (t *Token) Path() string { return t.file.path }

// Check reports whether presented is the token, comparing SHA-256
// digests in constant time.
func (t *Token) Check(presented string) bool {
	d := Hash(presented)
	return subtle.ConstantTimeCompare(d[:], t.digest.Load()[:]) == 1
}

// Reload rereads the token file; on failure the old token stays (see
// Keys.Reload).
func (t *Token) Reload() (bool, error) { return t.reload(true) }

// ReloadIfChanged rereads the token file when it changed (see
// Keys.ReloadIfChanged).
func (t *Token) ReloadIfChanged() (bool, error) { return t.reload(false) }

func (t *Token) reload(force bool) (bool, error) {
	return t.file.reload(force, func(data []byte) error {
		tok := bytes.TrimSpace(data)
		if err := checkSecret(tok, "token"); err != nil {
			return fmt.Errorf("apikey: %s: %w", t.file.path, err)
		}
		d := sha256.Sum256(tok)
		t.digest.Store(&d)
		return nil
	})
}
