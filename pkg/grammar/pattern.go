package grammar

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// errPatternUnsupported is a valid regular expression with no GBNF
// equivalent here (llama.cpp's unsupported_pattern): the string is then
// any string, as llama.cpp makes it. Any other error of patternRule is an
// invalid pattern, which refuses the schema.
var errPatternUnsupported = errors.New("pattern not supported")

// maxPatternDepth bounds the nesting of a pattern's groups (llama.cpp's
// MAX_PATTERN_DEPTH).
const maxPatternDepth = 100

const (
	// nonLiteral are the characters that end a literal run of a pattern.
	nonLiteral = "|.()[]{}*+?^$"
	// escapedInRegexps are the escapes that stand for the character itself.
	escapedInRegexps = "^$.[](){}*+?|"
)

// gbnfEscapeLen is the length of the GBNF escape at p[i] (\xHH, \uHHHH,
// \UHHHHHHHH, \t \r \n \\ \" \[ \]), or 0.
func gbnfEscapeLen(p string, i int) int {
	if i+1 >= len(p) || p[i] != '\\' {
		return 0
	}
	n := 0
	switch p[i+1] {
	case 'x':
		n = 2
	case 'u':
		n = 4
	case 'U':
		n = 8
	case 't', 'r', 'n', '\\', '"', '[', ']':
		return 2
	default:
		return 0
	}
	if i+2+n > len(p) {
		return 0
	}
	if _, err := strconv.ParseUint(p[i+2:i+2+n], 16, 32); err != nil {
		return 0
	}
	return 2 + n
}

type litOrRule struct {
	s   string
	lit bool
}

func (x litOrRule) rule() string {
	if x.lit {
		return `"` + x.s + `"`
	}
	return x.s
}

// patternRule translates an anchored regular expression (^...$) of a
// string's value into the GBNF of the JSON string, as llama.cpp's
// _pattern_to_rule does: literals, ., groups (and (?:...)), classes
// copied as GBNF classes, |, *, +, ? and {m,n}. Repetitions of a group or
// class become rules (rule adds one). Errors: errPatternUnsupported (an
// unanchored pattern, an escape or group syntax GBNF lacks), an invalid
// pattern, a *LimitError from rule or over the repetition bound.
func patternRule(pattern string, rule func(string) (string, error)) (string, error) {
	if len(pattern) < 2 || pattern[0] != '^' || pattern[len(pattern)-1] != '$' {
		return "", fmt.Errorf("%w: not anchored with ^ and $", errPatternUnsupported)
	}
	sub := pattern[1 : len(pattern)-1]
	i, n, depth := 0, len(sub), 0
	subRules := map[string]string{}
	var transform func() (litOrRule, error)
	transform = func() (litOrRule, error) {
		var seq []litOrRule
		join := func() litOrRule {
			var parts []string
			lit := ""
			for _, x := range seq {
				if x.lit {
					lit += x.s
					continue
				}
				if lit != "" {
					parts = append(parts, `"`+lit+`"`)
					lit = ""
				}
				parts = append(parts, x.rule())
			}
			if lit != "" {
				parts = append(parts, `"`+lit+`"`)
			}
			return litOrRule{s: strings.Join(parts, " ")}
		}
		for i < n {
			c := sub[i]
			switch {
			case c == '.':
				seq = append(seq, litOrRule{s: dotClass})
				i++
			case c == '(':
				i++
				if i < n && sub[i] == '?' {
					if i+1 < n && sub[i+1] == ':' {
						i += 2
					} else {
						return litOrRule{}, fmt.Errorf("%w: group syntax (?%s", errPatternUnsupported, sub[i+1:min(i+2, n)])
					}
				}
				if depth++; depth > maxPatternDepth {
					return litOrRule{}, fmt.Errorf("%w: groups nested deeper than %d", errPatternUnsupported, maxPatternDepth)
				}
				inner, err := transform()
				if err != nil {
					return litOrRule{}, err
				}
				seq = append(seq, litOrRule{s: "(" + inner.rule() + ")"})
			case c == ')':
				i++
				if depth == 0 {
					return litOrRule{}, errors.New("unbalanced parentheses")
				}
				depth--
				return join(), nil
			case c == '^' || c == '$':
				return litOrRule{}, fmt.Errorf("%w: an anchor inside the pattern", errPatternUnsupported)
			case c == '[':
				cls := "["
				i++
				for i < n && sub[i] != ']' {
					if sub[i] == '\\' {
						l := gbnfEscapeLen(sub, i)
						switch {
						case l > 0:
							cls += sub[i : i+l]
							i += l
						case i+1 < n && classShorthand[sub[i+1]] != "":
							cls += classShorthand[sub[i+1]]
							i += 2
						case i+1 < n && isPunct(sub[i+1]):
							cls += fmt.Sprintf(`\x%02X`, sub[i+1])
							i += 2
						default:
							return litOrRule{}, fmt.Errorf("%w: escape %s in a character class", errPatternUnsupported, sub[i:min(i+2, n)])
						}
					} else {
						cls += sub[i : i+1]
						i++
					}
				}
				if i >= n {
					return litOrRule{}, errors.New("unterminated character class")
				}
				i++
				seq = append(seq, litOrRule{s: jsonSafeClass(cls + "]")})
			case c == '\\' && i+1 < n && shorthand[sub[i+1]] != "":
				seq = append(seq, litOrRule{s: shorthand[sub[i+1]]})
				i += 2
			case c == '|':
				seq = append(seq, litOrRule{s: "|"})
				i++
			case c == '*' || c == '+' || c == '?':
				if len(seq) == 0 || seq[len(seq)-1] == (litOrRule{s: "|"}) {
					return litOrRule{}, errors.New("nothing to repeat")
				}
				seq[len(seq)-1] = litOrRule{s: seq[len(seq)-1].rule() + string(c)}
				i++
			case c == '{':
				j := strings.IndexByte(sub[i:], '}')
				if j < 0 {
					return litOrRule{}, fmt.Errorf("%w: unterminated curly brackets", errPatternUnsupported)
				}
				spec := sub[i+1 : i+j]
				i += j + 1
				lo, hi, err := repetitionBounds(spec)
				if err != nil {
					return litOrRule{}, err
				}
				if len(seq) == 0 || seq[len(seq)-1] == (litOrRule{s: "|"}) {
					return litOrRule{}, errors.New("nothing to repeat")
				}
				last := seq[len(seq)-1]
				item := last.rule()
				if !last.lit {
					id, ok := subRules[last.s]
					if !ok {
						if id, err = rule(last.s); err != nil {
							return litOrRule{}, err
						}
						subRules[last.s] = id
					}
					item = id
				}
				r := repetition(item, lo, hi, "")
				if r == "" { // {0}: nothing, which a quantifier may still follow
					r = `""`
				}
				seq[len(seq)-1] = litOrRule{s: r}
			default:
				lit := ""
				for i < n {
					switch {
					case sub[i] == '\\':
						if i == n-1 {
							return litOrRule{}, errors.New("trailing backslash")
						}
						next := sub[i+1]
						if strings.IndexByte(escapedInRegexps, next) >= 0 {
							lit += sub[i+1 : i+2]
							i += 2
							continue
						}
						if shorthand[next] != "" {
							break // a class of its own
						}
						if l := gbnfEscapeLen(sub, i); l > 0 {
							lit += jsonChar(unescape(sub[i : i+l]))
							i += l
							continue
						}
						if isPunct(next) {
							lit += jsonChar(rune(next))
							i += 2
							continue
						}
						return litOrRule{}, fmt.Errorf("%w: escape %s", errPatternUnsupported, sub[i:i+2])
					case strings.IndexByte(nonLiteral, sub[i]) < 0 &&
						(i == n-1 || lit == "" || sub[i+1] == '.' || strings.IndexByte(nonLiteral, sub[i+1]) < 0):
						r, size := utf8.DecodeRuneInString(sub[i:])
						lit += jsonChar(r)
						i += size
						continue
					}
					break
				}
				if lit == "" {
					return litOrRule{}, fmt.Errorf("%w: character %q", errPatternUnsupported, c)
				}
				seq = append(seq, litOrRule{s: lit, lit: true})
			}
		}
		return join(), nil
	}
	top, err := transform()
	if err != nil {
		return "", err
	}
	if depth != 0 {
		return "", errors.New("unbalanced parentheses")
	}
	return `"\"" (` + top.rule() + `) "\""`, nil
}

// repetitionBounds parses the m, m, ,n or m,n of a pattern's {...}; an
// absent upper bound is -1. Counts over maxRepeat are a *LimitError.
func repetitionBounds(spec string) (int, int, error) {
	parts := strings.Split(spec, ",")
	if len(parts) > 2 {
		return 0, 0, fmt.Errorf("%w: {%s}", errPatternUnsupported, spec)
	}
	num := func(s string, def int) (int, error) {
		if s == "" && len(parts) == 2 {
			return def, nil
		}
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v < 0 {
			return 0, fmt.Errorf("%w: {%s}", errPatternUnsupported, spec)
		}
		if v > maxRepeat {
			return 0, &LimitError{Limit: "repetitions", Max: maxRepeat}
		}
		return v, nil
	}
	lo, err := num(parts[0], 0)
	if err != nil {
		return 0, 0, err
	}
	if len(parts) == 1 {
		return lo, lo, nil
	}
	hi, err := num(parts[1], -1)
	if err != nil {
		return 0, 0, err
	}
	if hi >= 0 && hi < lo {
		return 0, 0, fmt.Errorf("{%s}: maximum below minimum", spec)
	}
	return lo, hi, nil
}

// repetition is llama.cpp's build_repetition: item repeated lo to hi
// times (hi < 0: no bound), separated by sep when sep is not empty.
func repetition(item string, lo, hi int, sep string) string {
	if hi == 0 {
		return ""
	}
	if lo == 0 && hi == 1 {
		return item + "?"
	}
	if sep == "" {
		switch {
		case lo == 1 && hi < 0:
			return item + "+"
		case lo == 0 && hi < 0:
			return item + "*"
		case hi < 0:
			return fmt.Sprintf("%s{%d,}", item, lo)
		}
		return fmt.Sprintf("%s{%d,%d}", item, lo, hi)
	}
	restHi := hi
	if hi > 0 {
		restHi = hi - 1
	}
	r := item + " " + repetition("("+sep+" "+item+")", max(lo-1, 0), restHi, "")
	if lo == 0 {
		r = "(" + r + ")?"
	}
	return r
}

// dotClass is a pattern's ".": any character but a line break, as
// llama.cpp's, less the characters a JSON string cannot hold unescaped
// (", \ and the controls), so that the string stays JSON.
const dotClass = `[^"\\\x00-\x1F]`

// jsonSafeClass keeps a negated class of a pattern from matching the
// characters a JSON string cannot hold unescaped.
func jsonSafeClass(cls string) string {
	if strings.HasPrefix(cls, "[^") {
		return `[^"\\\x00-\x1F` + cls[2:]
	}
	return cls
}

// Beyond llama.cpp, which gives up on them (any string): the shorthands
// \d \w \s and their negations, as classes of JSON text (\s as a space
// or the escape of a tab, line feed, carriage return or form feed), and
// an escaped punctuation character, which stands for itself (\- \/ \' in
// zod's email pattern).
var shorthand = map[byte]string{
	'd': `[0-9]`,
	'w': `[0-9A-Za-z_]`,
	's': `( " " | "\\" [tnrf] )`,
	'D': `[^"\\\x00-\x1F0-9]`,
	'W': `[^"\\\x00-\x1F0-9A-Za-z_]`,
	'S': `[^"\\\x00-\x20]`,
}

// classShorthand are the shorthands inside a class.
var classShorthand = map[byte]string{'d': `0-9`, 'w': `0-9A-Za-z_`, 's': ` `}

func isPunct(c byte) bool {
	return c > 0x20 && c < 0x7F && !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z')
}

// unescape returns the character of a GBNF escape (gbnfEscapeLen).
func unescape(e string) rune {
	switch e[1] {
	case 't':
		return '\t'
	case 'r':
		return '\r'
	case 'n':
		return '\n'
	case 'x', 'u', 'U':
		v, _ := strconv.ParseUint(e[2:], 16, 32)
		return rune(v)
	}
	return rune(e[1])
}

// jsonChar is the GBNF literal text of r as a JSON string writes it:
// unlike llama.cpp, which writes " \ and controls raw (not JSON), a
// pattern's " is \" in the string, and a line feed \n.
func jsonChar(r rune) string {
	switch r {
	case '"':
		return `\\\"`
	case '\\':
		return `\\\\`
	case '\n':
		return `\\n`
	case '\r':
		return `\\r`
	case '\t':
		return `\\t`
	case '\b':
		return `\\b`
	case '\f':
		return `\\f`
	}
	if r < 0x20 {
		return fmt.Sprintf(`\\u%04x`, r)
	}
	return string(r)
}
