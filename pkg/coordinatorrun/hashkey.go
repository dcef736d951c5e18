package coordinatorrun

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/apikey"
)

// HashKey is the hash-key subcommand: it reads one API key from stdin
// (surrounding whitespace ignored) and prints its line for the --api-keys
// file, with --name, --rpm and --tpm. It returns the exit code: 0, or 2
// for bad flags or a bad key (the error never holds the key).
func HashKey(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("coordinator hash-key", flag.ContinueOnError)
	name := fs.String("name", "", "the key's name: its surface for prompt budgets, and how logs name it (A-Z a-z 0-9 . _ - @, at most 64)")
	rpm := fs.Int("rpm", 0, fmt.Sprintf("requests a minute the key may send (0: no limit; at most %d)", apikey.MaxLimit))
	tpm := fs.Int("tpm", 0, "tokens a minute the key may use: prompt + n × max_tokens at admission, the unused part given back (0: no limit)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: coordinator hash-key [--name NAME] [--rpm N] [--tpm N] < KEYFILE\n\n"+
			"Reads one API key on stdin and prints its line for the --api-keys file: the key's\n"+
			"sha256, never the key. Keys are at least %d bytes of printable ASCII, e.g.\n"+
			"  openssl rand -hex 32 | tee key.txt | coordinator hash-key --name team-a >> api-keys\n\nFlags:\n", apikey.MinKeyLen)
		fs.PrintDefaults()
	}
	if code, ok := cliflags.ParseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 { // never echoed: it may be the key
		fmt.Fprintf(stderr, "coordinator hash-key: the key is read from stdin, not from arguments (%d given)\n", fs.NArg())
		return 2
	}
	data, err := io.ReadAll(io.LimitReader(stdin, 64<<10))
	if err != nil {
		fmt.Fprintf(stderr, "coordinator hash-key: read stdin: %v\n", err)
		return 2
	}
	key := string(bytes.TrimSpace(data))
	if strings.ContainsAny(key, "\r\n") {
		fmt.Fprintln(stderr, "coordinator hash-key: stdin holds more than one line: give one key per run")
		return 2
	}
	line, err := apikey.FormatLine(key, *name, *rpm, *tpm)
	if err != nil {
		fmt.Fprintf(stderr, "coordinator hash-key: %v\n", err)
		return 2
	}
	fmt.Fprintln(stdout, line)
	return 0
}
