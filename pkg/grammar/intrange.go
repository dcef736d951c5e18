package grammar

import (
	"strconv"
	"strings"
)

// maxSafe is the largest integer every IEEE double between -maxSafe and
// maxSafe holds exactly (2^53-1, JavaScript's Number.MAX_SAFE_INTEGER,
// which zod 4 writes as the bounds of every .int()).
const maxSafe = 1<<53 - 1

// intRange returns the GBNF of the integers in [lo, hi] written as JSON
// writes them (no leading zeros, "-" for negatives), as digit classes:
// llama.cpp's build_min_max_int with both bounds. Callers clamp lo and hi
// to ±maxSafe (an absent bound is that bound) and check lo <= hi, so
// every integer allowed is exact as a double; the grammar has at most a
// few hundred elements. negZero allows "-0" where the range holds 0, as
// llama.cpp's does when the schema gives a negative minimum.
func intRange(lo, hi int64, negZero bool) string {
	var out strings.Builder
	minMaxInt(lo, hi, negZero, &out)
	return "(" + out.String() + ")"
}

func minMaxInt(lo, hi int64, negZero bool, out *strings.Builder) {
	if lo < 0 && hi < 0 {
		out.WriteString(`"-" (`)
		minMaxInt(-hi, -lo, false, out)
		out.WriteString(")")
		return
	}
	if lo < 0 {
		out.WriteString(`"-" (`)
		if negZero {
			minMaxInt(0, -lo, false, out)
		} else {
			minMaxInt(1, -lo, false, out)
		}
		out.WriteString(") | ")
		lo = 0
	}
	minS, maxS := strconv.FormatInt(lo, 10), strconv.FormatInt(hi, 10)
	for digits := len(minS); digits < len(maxS); digits++ {
		uniformRange(minS, strings.Repeat("9", digits), out)
		minS = "1" + strings.Repeat("0", digits)
		out.WriteString(" | ")
	}
	uniformRange(minS, maxS, out)
}

func digitRange(from, to byte, out *strings.Builder) {
	out.WriteByte('[')
	out.WriteByte(from)
	if from != to {
		out.WriteByte('-')
		out.WriteByte(to)
	}
	out.WriteByte(']')
}

func moreDigits(n int, out *strings.Builder) {
	out.WriteString("[0-9]")
	if n != 1 {
		out.WriteString("{" + strconv.Itoa(n) + "}")
	}
}

// uniformRange writes the numbers of len(from) digits from from to to.
func uniformRange(from, to string, out *strings.Builder) {
	i := 0
	for i < len(from) && i < len(to) && from[i] == to[i] {
		i++
	}
	if i > 0 {
		out.WriteString(`"` + from[:i] + `"`)
	}
	if i >= len(from) || i >= len(to) {
		return
	}
	if i > 0 {
		out.WriteByte(' ')
	}
	subLen := len(from) - i - 1
	if subLen == 0 {
		digitRange(from[i], to[i], out)
		return
	}
	fromSub, toSub := from[i+1:], to[i+1:]
	zeros, nines := strings.Repeat("0", subLen), strings.Repeat("9", subLen)
	toReached := false
	out.WriteByte('(')
	if fromSub == zeros {
		digitRange(from[i], to[i]-1, out)
		out.WriteByte(' ')
		moreDigits(subLen, out)
	} else {
		out.WriteString("[" + string(from[i]) + "] (")
		uniformRange(fromSub, nines, out)
		out.WriteByte(')')
		if from[i] < to[i]-1 {
			out.WriteString(" | ")
			if toSub == nines {
				digitRange(from[i]+1, to[i], out)
				toReached = true
			} else {
				digitRange(from[i]+1, to[i]-1, out)
			}
			out.WriteByte(' ')
			moreDigits(subLen, out)
		}
	}
	if !toReached {
		out.WriteString(" | ")
		digitRange(to[i], to[i], out)
		out.WriteByte(' ')
		uniformRange(zeros, toSub, out)
	}
	out.WriteByte(')')
}
