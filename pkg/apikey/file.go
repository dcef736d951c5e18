package apikey

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// HashPrefix is how a key file line begins: "sha256:" and 64 hex digits.
const HashPrefix = "sha256:"

// MaxLimit is the largest rpm or tpm of a key: 100 million a minute.
const MaxLimit = 100_000_000

// MinKeyLen is the shortest key FormatLine takes, in bytes.
const MinKeyLen = 16

// Errors of a key file, wrapped with the line's number; match with
// errors.Is.
var (
	// ErrPlaintext: a line does not begin with sha256:<64 hex digits>,
	// as when a key was written in plaintext.
	ErrPlaintext = errors.New("not a sha256:<64 hex digits> key hash (a plaintext key? write its hash instead: coordinator hash-key < KEY)")
	// ErrInvalid: anything else wrong with a key file or a key.
	ErrInvalid = errors.New("invalid")
)

// Entry is one line of a key file.
type Entry struct {
	// Digest is the SHA-256 of the key.
	Digest [sha256.Size]byte
	// Name is the line's name=, or "" when it has none (see Label).
	Name string
	// Tenant is the line's tenant=, or "": the key's prefix-cache
	// partition is then its own (see Key.Tenant).
	Tenant string
	// RPM and TPM are the requests and tokens a minute the key may use,
	// 1..MaxLimit; 0: no limit.
	RPM, TPM int
	// Line is the entry's line number in the file, from 1.
	Line int
}

// Label returns the key's name, or "sha256:" and the first 8 hex digits
// of its digest when it has none.
func (e Entry) Label() string {
	if e.Name != "" {
		return e.Name
	}
	return HashPrefix + DigestPrefix(e.Digest)
}

// Hash returns the SHA-256 of key.
func Hash(key string) [sha256.Size]byte { return sha256.Sum256([]byte(key)) }

// DigestPrefix returns the first 8 hex digits of d: what logs may show of
// a key.
func DigestPrefix(d [sha256.Size]byte) string { return hex.EncodeToString(d[:4]) }

// checkSecret reports (wrapping ErrInvalid, never holding the secret) a
// secret, what ("key", "token"), shorter than MinKeyLen or with bytes
// other than printable ASCII without spaces: what an Authorization
// header carries.
func checkSecret(b []byte, what string) error {
	if len(b) < MinKeyLen {
		return fmt.Errorf("%w: the %s has %d bytes, fewer than %d", ErrInvalid, what, len(b), MinKeyLen)
	}
	for i, c := range b {
		if c <= ' ' || c > '~' {
			return fmt.Errorf("%w: byte %d of the %s is not printable ASCII (or is a space)", ErrInvalid, i, what)
		}
	}
	return nil
}

// FormatLine returns the key file line of key: its hash, then name=,
// rpm= and tpm= when set (name "" and limits 0 are left out). Errors
// (wrapping ErrInvalid, never holding the key): a key shorter than
// MinKeyLen or with bytes other than printable ASCII without spaces (what
// an Authorization header carries), an invalid name, a limit out of
// [0, MaxLimit].
func FormatLine(key, name string, rpm, tpm int) (string, error) {
	if err := checkSecret([]byte(key), "key"); err != nil {
		return "", fmt.Errorf("apikey: %w", err)
	}
	if name != "" && !validName(name) {
		return "", fmt.Errorf("apikey: %w: name must be 1 to 64 of A-Z a-z 0-9 . _ - @", ErrInvalid)
	}
	for _, l := range []struct {
		name string
		v    int
	}{{"rpm", rpm}, {"tpm", tpm}} {
		if l.v < 0 || l.v > MaxLimit {
			return "", fmt.Errorf("apikey: %w: %s %d out of [0, %d] (0: no limit)", ErrInvalid, l.name, l.v, MaxLimit)
		}
	}
	d := Hash(key)
	var b strings.Builder
	b.WriteString(HashPrefix + hex.EncodeToString(d[:]))
	if name != "" {
		b.WriteString(" name=" + name)
	}
	if rpm > 0 {
		b.WriteString(" rpm=" + strconv.Itoa(rpm))
	}
	if tpm > 0 {
		b.WriteString(" tpm=" + strconv.Itoa(tpm))
	}
	return b.String(), nil
}

// ParseFile reads and parses the key file at path. Errors: the file's,
// and Parse's prefixed with path.
func ParseFile(path string) ([]Entry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("apikey: %w", err)
	}
	es, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("apikey: %s: %w", path, err)
	}
	return es, nil
}

// Parse parses a key file (see the package doc). The entries are in file
// order, none for a file without keys (which revokes every key); the
// caller owns them. Errors name the line ("line 3: …") and
// wrap ErrPlaintext or ErrInvalid; they never hold the line's text.
func Parse(data []byte) ([]Entry, error) {
	var out []Entry
	seen := make(map[[sha256.Size]byte]int)
	for i, line := range strings.Split(string(data), "\n") {
		n := i + 1
		if c := strings.IndexByte(line, '#'); c >= 0 {
			line = line[:c]
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		e, err := parseLine(fields)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		e.Line = n
		if prev, dup := seen[e.Digest]; dup {
			return nil, fmt.Errorf("line %d: %w: the same key as line %d", n, ErrInvalid, prev)
		}
		seen[e.Digest] = n
		out = append(out, e)
	}
	return out, nil // none: every request is refused (see the package doc)
}

// parseLine parses the fields of one line. Its errors hold no field's
// text: a mistyped line may hold a key.
func parseLine(fields []string) (Entry, error) {
	var e Entry
	h, ok := strings.CutPrefix(fields[0], HashPrefix)
	if !ok {
		return e, ErrPlaintext
	}
	if len(h) != 2*sha256.Size {
		return e, fmt.Errorf("%w: %s must be followed by 64 hex digits, not %d characters", ErrInvalid, HashPrefix, len(h))
	}
	if _, err := hex.Decode(e.Digest[:], []byte(h)); err != nil {
		return e, fmt.Errorf("%w: %s must be followed by 64 hex digits", ErrInvalid, HashPrefix)
	}
	set := make(map[string]bool)
	for j, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		switch {
		case !ok || (k != "name" && k != "rpm" && k != "tpm" && k != "tenant"):
			return e, fmt.Errorf("%w: field %d must be name=, tenant=, rpm= or tpm=", ErrInvalid, j+2)
		case set[k]:
			return e, fmt.Errorf("%w: %s= given twice", ErrInvalid, k)
		}
		set[k] = true
		if k == "name" {
			if !validName(v) {
				return e, fmt.Errorf("%w: name must be 1 to 64 of A-Z a-z 0-9 . _ - @", ErrInvalid)
			}
			e.Name = v
			continue
		}
		if k == "tenant" {
			if !validName(v) {
				return e, fmt.Errorf("%w: tenant must be 1 to 64 of A-Z a-z 0-9 . _ - @", ErrInvalid)
			}
			e.Tenant = v
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxLimit {
			return e, fmt.Errorf("%w: %s must be an integer in [1, %d]", ErrInvalid, k, MaxLimit)
		}
		if k == "rpm" {
			e.RPM = n
		} else {
			e.TPM = n
		}
	}
	return e, nil
}

// validName reports whether s is 1 to 64 of A-Z a-z 0-9 . _ - @.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-', c == '@':
		default:
			return false
		}
	}
	return true
}
