package flagvocab

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Check returns the problems of the flags of a set of commands, sorted:
//
//   - a name whose flags print different usages in different commands
//     (two registrations) without an entry in Meanings that says what
//     the name means in all of them;
//   - a name that stands for two flags: a former name (cliflags.AddRenamed)
//     of one flag in one command and another flag, or the former name of
//     a third, in another (unless Synonyms says the two are one meaning);
//   - with all set (flags holds every binary's flags), an entry of
//     Meanings, Synonyms or Clashes that no longer applies, so that the
//     tables only hold what is true.
//
// Clashes lists the names known to carry two meanings still: Check
// reports them only when they no longer do.
func Check(flags []Flag, all bool) []string {
	byName := map[string][]Flag{}
	for _, f := range flags {
		byName[f.Name] = append(byName[f.Name], f)
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	for name, fs := range byName {
		clash := meaningsOf(fs)
		usages := map[string][]string{}
		for _, f := range fs {
			if f.Former == "" {
				u := defaultSuffix.ReplaceAllString(f.Usage, "")
				usages[u] = append(usages[u], f.Command)
			}
		}
		_, known := Clashes[name]
		_, said := Meanings[name]
		switch {
		case known && said:
			bad("--%s is in both Meanings and Clashes", name)
		case known && len(clash) <= 1 && len(usages) <= 1 && all:
			bad("--%s is listed in Clashes but carries one meaning now: remove it from the list", name)
		case known:
		case len(clash) > 1:
			bad("--%s carries %d meanings: %s (rename one; a former name must not be another flag's name)", name, len(clash), strings.Join(clash, "; "))
		case len(usages) > 1 && !said:
			var us []string
			for u, cs := range usages {
				slices.Sort(cs)
				us = append(us, fmt.Sprintf("%s: %q", strings.Join(cs, ", "), u))
			}
			sort.Strings(us)
			bad("--%s has %d registrations with different usages (%s): if it means one thing, say what in Meanings; else rename one", name, len(usages), strings.Join(us, "; "))
		case len(usages) <= 1 && said && all:
			bad("--%s is in Meanings but has one registration: remove its entry", name)
		}
	}
	if !all {
		sort.Strings(problems)
		return problems
	}
	for name := range Meanings {
		if _, ok := byName[name]; !ok {
			bad("--%s is in Meanings but no command has it", name)
		}
	}
	for name := range Synonyms {
		if _, ok := byName[name]; !ok {
			bad("--%s is in Synonyms but no command has it", name)
		}
	}
	for name := range Clashes {
		if _, ok := byName[name]; !ok {
			bad("--%s is in Clashes but no command has it", name)
		}
	}
	sort.Strings(problems)
	return problems
}

// defaultSuffix is the "(default X)" the flag package appends to a usage:
// the same flag may default differently in different commands.
var defaultSuffix = regexp.MustCompile(` \(default .*\)$`)

// meaningsOf returns the distinct meanings the flags of one name carry,
// each as "FLAG (in COMMANDS)": a flag means itself, a former name the
// flag it stands for, and Synonyms maps a name to the flag it means.
func meaningsOf(fs []Flag) []string {
	in := map[string][]string{}
	for _, f := range fs {
		m := f.Name
		if f.Former != "" {
			m = f.Former
		} else if s, ok := Synonyms[f.Name]; ok {
			m = s
		}
		in[m] = append(in[m], f.Command)
	}
	var out []string
	for m, cs := range in {
		slices.Sort(cs)
		out = append(out, fmt.Sprintf("--%s (in %s)", m, strings.Join(slices.Compact(cs), ", ")))
	}
	sort.Strings(out)
	return out
}
