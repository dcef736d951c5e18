package coordinatorrun

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

const (
	authKeyA = "sk-coordinator-test-key-a-0123456789"
	authKeyB = "sk-coordinator-test-key-b-9876543210"
)

// hashKey runs the hash-key subcommand on key with args and returns its
// line, failing the test unless it succeeds.
func hashKey(t *testing.T, key string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := HashKey(args, strings.NewReader(key+"\n"), &out, &errOut); code != 0 {
		t.Fatalf("hash-key exit %d: %s", code, errOut.String())
	}
	return out.String()
}

func TestHashKeyCommand(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		stdin    string
		code     int
		wantOut  string // prefix of stdout
		wantErr  string // substring of stderr
		noEchoOf string // must not appear in stderr
	}{
		{name: "key", stdin: authKeyA + "\n", wantOut: "sha256:"},
		{name: "name and limits", args: []string{"--name", "team-a", "--rpm", "600", "--tpm", "200000"}, stdin: "  " + authKeyA + "\r\n", wantOut: "sha256:"},
		{name: "short key", stdin: "sk-short\n", code: 2, wantErr: "fewer than 16", noEchoOf: "sk-short"},
		{name: "two keys", stdin: authKeyA + "\n" + authKeyB + "\n", code: 2, wantErr: "more than one line", noEchoOf: authKeyA},
		{name: "key as an argument", args: []string{authKeyA}, code: 2, wantErr: "from stdin", noEchoOf: authKeyA},
		{name: "bad name", args: []string{"--name", "a b"}, stdin: authKeyA, code: 2, wantErr: "name must be"},
		{name: "help", args: []string{"--help"}, code: 0, wantOut: "Usage: coordinator hash-key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := HashKey(tc.args, strings.NewReader(tc.stdin), &out, &errOut)
			if code != tc.code || !strings.HasPrefix(out.String(), tc.wantOut) || !strings.Contains(errOut.String(), tc.wantErr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, %q, %q", code, out.String(), errOut.String(), tc.code, tc.wantOut, tc.wantErr)
			}
			if tc.noEchoOf != "" && strings.Contains(errOut.String()+out.String(), tc.noEchoOf) {
				t.Errorf("output echoes the key: %q", errOut.String())
			}
			if strings.Contains(out.String(), authKeyA) {
				t.Errorf("stdout holds the key: %q", out.String())
			}
		})
	}
	if got := hashKey(t, authKeyA, "--name", "team-a", "--rpm", "600", "--tpm", "200000"); !strings.HasSuffix(got, " name=team-a rpm=600 tpm=200000\n") {
		t.Errorf("hash-key line %q", got)
	}
	var out bytes.Buffer
	if code := Main(context.Background(), []string{"hash-key", "--help"}, &out, &out); code != 0 || !strings.Contains(out.String(), "--api-keys") {
		t.Errorf("coordinator hash-key --help: exit %d, %q", code, out.String())
	}
}
