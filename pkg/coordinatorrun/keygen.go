package coordinatorrun

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/grpcauth"
)

// Keygen is the keygen subcommand: it writes a new Ed25519 key pair for
// the per-call gRPC credentials, the private key (mode 0600) for the
// coordinator's --grpc-signing-key and the public key for the workers'
// --grpc-verify-key. It refuses to overwrite a file. It returns the exit
// code: 0, 1 when a file cannot be written, 2 for bad flags.
func Keygen(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("coordinator keygen", flag.ContinueOnError)
	private := fs.String("private", "grpc-signing.pem", "file to write the private key to (the coordinator's --grpc-signing-key; a Secret)")
	public := fs.String("public", "grpc-verify.pem", "file to write the public key to (every worker's --grpc-verify-key)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: coordinator keygen [--private FILE] [--public FILE]\n\n"+
			"Writes a new Ed25519 key pair: the coordinator signs a credential for each gRPC\n"+
			"call with the private key, bound to the worker, the method and a short expiry,\n"+
			"and workers check it with the public key, which lets nobody sign. The same with\n"+
			"openssl:\n"+
			"  openssl genpkey -algorithm ed25519 -out grpc-signing.pem\n"+
			"  openssl pkey -in grpc-signing.pem -pubout -out grpc-verify.pem\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := cliflags.ParseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "coordinator keygen: unexpected arguments %q\n", fs.Args())
		return 2
	}
	priv, pub, err := grpcauth.GenerateKey()
	if err != nil {
		fmt.Fprintf(stderr, "coordinator keygen: %v\n", err)
		return 1
	}
	if err := writeNew(*private, priv, 0o600); err != nil {
		fmt.Fprintf(stderr, "coordinator keygen: %v\n", err)
		return 1
	}
	if err := writeNew(*public, pub, 0o644); err != nil {
		_ = os.Remove(*private) // no half pair left behind
		fmt.Fprintf(stderr, "coordinator keygen: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "private key (coordinator --grpc-signing-key): %s\npublic key (workers --grpc-verify-key): %s\n",
		filepath.Clean(*private), filepath.Clean(*public))
	return 0
}

// writeNew writes data to a new file of mode perm; an existing file is an
// error.
func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%s exists: not overwriting a key", path)
		}
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
