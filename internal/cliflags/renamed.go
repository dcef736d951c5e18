package cliflags

import (
	"errors"
	"flag"
	"fmt"
	"sort"
)

// Renamed is a flag's former name, kept working for one release: given,
// it sets the flag called New.
type Renamed struct {
	Old, New string
}

// Deprecation is the warning a program logs, once at start, for each
// former name it was given: "flag --OLD is deprecated, use --NEW".
func (r Renamed) Deprecation() string {
	return fmt.Sprintf("flag --%s is deprecated, use --%s", r.Old, r.New)
}

// AddRenamed registers each r.Old on fs as a former name of the flag
// r.New, which must be registered already (AddRenamed panics otherwise, as
// fs.Var does on a name registered twice: both are mistakes of the
// program, not of its user). A former name takes the values its flag
// takes and sets that flag; PrintGroups lists it under "Deprecated"
// whatever the groups name; Parse and ParseFlags then refuse a former
// name and its flag given different values, and mark the flag given
// (fs.Visit sees it) when only its former name was.
func AddRenamed(fs *flag.FlagSet, renames ...Renamed) {
	for _, r := range renames {
		f := fs.Lookup(r.New)
		if f == nil {
			panic(fmt.Sprintf("cliflags: --%s renamed to --%s, which is not defined", r.Old, r.New))
		}
		rec, ok := f.Value.(*recorded)
		if !ok {
			rec = &recorded{Value: f.Value}
			f.Value = rec
		}
		fs.Var(&alias{Renamed: r, target: rec}, r.Old, "former name of --"+r.New+", removed in the next release")
		fs.Lookup(r.Old).DefValue = ""
	}
}

// recorded wraps the Value of the flag a former name stands for, to keep
// what its own name was given (the former name writes the same Value).
// PrintGroups prints the flag by the Value it wraps.
type recorded struct {
	flag.Value
	raw string
	set bool
}

func (v *recorded) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		return err
	}
	v.raw, v.set = s, true
	return nil
}

// Get is the flag's Get, where it has one (flag.Getter); else nil.
func (v *recorded) Get() any {
	if g, ok := v.Value.(flag.Getter); ok {
		return g.Get()
	}
	return nil
}

func (v *recorded) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// alias is the Value of a former name: it sets its flag's Value and
// keeps what it was given.
type alias struct {
	Renamed
	target *recorded
	raw    string
	set    bool
}

func (a *alias) String() string {
	if a == nil || a.target == nil {
		return "" // the flag package's zero value, for PrintDefaults
	}
	return a.target.Value.String()
}

func (a *alias) Set(s string) error {
	if err := a.target.Value.Set(s); err != nil {
		return err
	}
	a.raw, a.set = s, true
	return nil
}

func (a *alias) IsBoolFlag() bool { return a.target.IsBoolFlag() }

// isAlias reports whether f is a former name (AddRenamed).
func isAlias(f *flag.Flag) bool {
	_, ok := f.Value.(*alias)
	return ok
}

// CurrentName returns the name of the flag that name stands for on fs:
// r.New for a former name r.Old (renamed true), name itself otherwise.
func CurrentName(fs *flag.FlagSet, name string) (current string, renamed bool) {
	if f := fs.Lookup(name); f != nil {
		if a, ok := f.Value.(*alias); ok {
			return a.New, true
		}
	}
	return name, false
}

// RenamedGiven returns the former names fs was given on its command line,
// sorted by former name, so that the program logs each one's Deprecation
// once its logger exists.
func RenamedGiven(fs *flag.FlagSet) []Renamed {
	var out []Renamed
	fs.Visit(func(f *flag.Flag) {
		if a, ok := f.Value.(*alias); ok && a.set {
			out = append(out, a.Renamed)
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Old < out[j].Old })
	return out
}

// resolveRenamed settles each former name given on fs's command line:
// given alone, its flag takes its value and counts as given; given beside
// its flag, the two must mean the same value (compared as the flag
// prints them, so --n=+10 and --n=10 agree), the flag's then stands.
// Errors, one per disagreeing pair: "--OLD A and --NEW B: --OLD is the
// former name of --NEW; give one".
func resolveRenamed(fs *flag.FlagSet) error {
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		a, ok := f.Value.(*alias)
		if !ok || !a.set {
			return
		}
		t := a.target
		if !t.set {
			// Mark the flag given, with the value the former name set.
			if err := fs.Set(a.New, a.raw); err != nil {
				errs = append(errs, BadFlag(a.Old, a.raw, err))
			}
			return
		}
		newRaw := t.raw
		oldValue, newValue := "", ""
		if err := t.Value.Set(a.raw); err == nil {
			oldValue = t.Value.String()
		}
		if err := t.Value.Set(newRaw); err != nil {
			errs = append(errs, BadFlag(a.New, newRaw, err))
			return
		}
		newValue = t.Value.String()
		if oldValue != newValue {
			errs = append(errs, fmt.Errorf("--%s %s and --%s %s: --%s is the former name of --%s; give one",
				a.Old, quote(a.raw), a.New, quote(newRaw), a.Old, a.New))
		}
	})
	return errors.Join(errs...)
}
