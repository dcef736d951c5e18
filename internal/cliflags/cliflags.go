// Package cliflags parses the command line of pdserve's binaries and
// subcommands the same way everywhere: -h prints the usage to stdout and
// exits 0, --version (where AddVersion registered it) prints the version
// to stdout and exits 0, a bad flag or an argument after the flags exits 2
// with a message on stderr. It also prints validation errors the same way:
// one line per problem, the program's name once (see Problems), and keeps
// the former names of renamed flags working for a release (AddRenamed).
package cliflags

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Parse parses args into fs, a ContinueOnError flag set named after its
// command (the name starts error messages). fs.Usage must print to
// fs.Output(): Parse points it at stdout for -h and --help. ok reports
// whether the command goes on; otherwise code is its exit status: 0 after
// -h or --help (the usage went to stdout) or --version (see AddVersion), 2
// after a bad flag ("NAME: flag provided but not defined: -x" and a hint to
// run --help, on stderr), a former name of a flag given beside it with
// another value (see AddRenamed) or a positional argument ("NAME:
// unexpected arguments [...]" on stderr).
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	if code, ok := ParseFlags(fs, args, stdout, stderr); !ok {
		return code, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return 2, false
	}
	return 0, true
}

// ParseFlags is Parse for a command that takes arguments after its flags
// (fs.Args()): it leaves them to the caller.
func ParseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	usage := fs.Usage
	var msg bytes.Buffer
	fs.Usage = func() {}
	fs.SetOutput(&msg)
	err := fs.Parse(args)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		if usage != nil {
			usage()
		} else {
			fmt.Fprintf(stdout, "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
		fs.SetOutput(stderr)
		return 0, false
	case err != nil:
		fs.SetOutput(stderr)
		fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", fs.Name(), strings.TrimSpace(msg.String()), fs.Name())
		return 2, false
	}
	fs.SetOutput(stderr)
	if err := resolveRenamed(fs); err != nil {
		PrintError(stderr, fs.Name(), err)
		return 2, false
	}
	if f := fs.Lookup("version"); f != nil {
		if v, isVersion := f.Value.(*versionFlag); isVersion && v.set {
			fmt.Fprintln(stdout, Version(fs.Name()))
			return 0, false
		}
	}
	return 0, true
}
