package frontend

import (
	"strings"
	"unicode/utf8"
)

// textStream turns output tokens into text deltas. It holds back bytes
// that may still become part of a stop string, and the bytes of an
// incomplete UTF-8 sequence at the end, so a client never sees text that a
// later token would retract or a broken character. Not safe for
// concurrent use.
type textStream struct {
	decode  func(id int32) []byte
	stops   []string
	pending []byte // decoded, not yet handed out
	stopped bool
	// matched is the stop string that stopped the stream, "" when none.
	matched string
}

// push adds the bytes of ids and returns the text that is now final. When
// a stop string completes, the returned text ends before it, stopped is
// true, and later calls return nothing.
func (s *textStream) push(ids []int32) (text string, stopped bool) {
	if s.stopped {
		return "", true
	}
	for _, id := range ids {
		s.pending = append(s.pending, s.decode(id)...)
	}
	if i, stop := s.firstStop(); i >= 0 {
		text = string(s.pending[:i])
		s.pending, s.stopped, s.matched = nil, true, stop
		return text, true
	}
	n := len(s.pending) - s.stopPrefixLen()
	n = completeUTF8(s.pending[:n])
	text = string(s.pending[:n])
	s.pending = append(s.pending[:0], s.pending[n:]...)
	return text, false
}

// flush returns whatever is held back (the stream ended).
func (s *textStream) flush() string {
	text := string(s.pending)
	s.pending = nil
	return text
}

// firstStop returns the index of the earliest stop string in pending, or
// -1, and that string.
func (s *textStream) firstStop() (int, string) {
	best, which := -1, ""
	p := string(s.pending)
	for _, stop := range s.stops {
		if i := strings.Index(p, stop); i >= 0 && (best < 0 || i < best) {
			best, which = i, stop
		}
	}
	return best, which
}

// stopPrefixLen returns the length of the longest suffix of pending that is
// a proper prefix of some stop string.
func (s *textStream) stopPrefixLen() int {
	longest := 0
	for _, stop := range s.stops {
		for k := min(len(stop)-1, len(s.pending)); k > longest; k-- {
			if string(s.pending[len(s.pending)-k:]) == stop[:k] {
				longest = k
				break
			}
		}
	}
	return longest
}

// completeUTF8 returns the length of the longest prefix of b that does not
// end inside an incomplete (but so far valid) UTF-8 sequence. Invalid bytes
// are not held back.
func completeUTF8(b []byte) int {
	// A UTF-8 sequence is at most 4 bytes: look at the last 3 positions for
	// a lead byte whose sequence runs past the end.
	for i := len(b) - 1; i >= 0 && i >= len(b)-3; i-- {
		if !utf8.RuneStart(b[i]) {
			continue
		}
		if !utf8.FullRune(b[i:]) {
			return i
		}
		break
	}
	return len(b)
}
