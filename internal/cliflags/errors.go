package cliflags

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strconv"
	"strings"
)

// FlagError is a bad value of a flag. Its message names the flag once,
// with the value and what is wrong with it:
//
//	--model /m.gguf: no such file or directory
//	--grpc-addr 9000: missing port in address
//
// errors.Is and errors.As see Err (the *fs.PathError, *net.AddrError, …).
type FlagError struct {
	Flag  string // the flag's name, without dashes
	Value string // the value given
	Err   error  // what is wrong with it
}

// BadFlag returns a *FlagError for flag (without dashes) set to value.
func BadFlag(flag, value string, err error) error {
	return &FlagError{Flag: flag, Value: value, Err: err}
}

func (e *FlagError) Error() string {
	return "--" + e.Flag + " " + quote(e.Value) + ": " + reason(e.Err, e.Value)
}

func (e *FlagError) Unwrap() error { return e.Err }

// quote returns v as is, or Go-quoted when it is empty or holds spaces,
// quotes or control characters (so that the value stands out).
func quote(v string) string {
	if v == "" || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r == '"' || r == '\'' || r == 0x7f }) {
		return strconv.Quote(v)
	}
	return v
}

// reason is err's message without what repeats the value: the operation
// and path of an *fs.PathError on value ("open /m.gguf: "), the "address
// VALUE: " of a *net.AddrError, and the package prefixes wrapped around
// them. Other errors keep their whole message.
func reason(err error, value string) string {
	if err == nil {
		return "invalid value"
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == value && pe.Err != nil {
		return pe.Err.Error()
	}
	var ae *net.AddrError
	if errors.As(err, &ae) && ae.Addr == value {
		return ae.Err
	}
	return err.Error()
}

// header is what the Validate methods of pdserve's packages put over the
// list of problems they found: "PKG: invalid options: ".
const header = "invalid options: "

// Problems returns the problems err reports, one per line to print: the
// errors joined by errors.Join (or by fmt.Errorf with several %w), each
// on its own, and without the "PKG: invalid options: " headers that
// wrap such lists (each package's Validate wraps its own, so they stack
// where one Validate calls another). Other wrapping stays: it says where a
// problem was found. Nil for a nil err.
func Problems(err error) []error {
	switch {
	case err == nil:
		return nil
	case isHeader(err):
		return Problems(errors.Unwrap(err))
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Problems(e)...)
		}
		return out
	}
	return []error{err}
}

// isHeader reports whether err is an "… invalid options: " prefix over
// the error it wraps.
func isHeader(err error) bool {
	inner := errors.Unwrap(err)
	if inner == nil {
		return false
	}
	msg, in := err.Error(), inner.Error()
	return strings.HasSuffix(msg, in) && strings.HasSuffix(msg[:len(msg)-len(in)], header)
}

// PrintError writes each of err's Problems to w on a line of its own,
// "NAME: PROBLEM", where name is the command's name. A problem whose
// message already starts with "NAME: " (an error of the package the
// command is named after) is not prefixed twice.
func PrintError(w io.Writer, name string, err error) {
	for _, p := range Problems(err) {
		msg := p.Error()
		if !strings.HasPrefix(msg, name+": ") {
			msg = name + ": " + msg
		}
		fmt.Fprintln(w, msg)
	}
}
