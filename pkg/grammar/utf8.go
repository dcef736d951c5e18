package grammar

// partial is a UTF-8 sequence a token's text left unfinished
// (llama_partial_utf8): the bits of its bytes so far and the number of
// continuation bytes still to come; remain < 0 marks an invalid sequence.
type partial struct {
	value  uint32
	remain int
}

// decodeUTF8 is llama.cpp's decode_utf8: the code points of text, read as
// a C string (up to its first NUL byte), continuing the sequence part
// left unfinished, appended to buf; the sequence text leaves unfinished;
// and false when text breaks UTF-8 where llama.cpp checks it (a byte that
// cannot start a sequence, or one that does not continue part). Like
// llama.cpp it does not check the continuation bytes of a sequence
// started in text, nor overlong forms.
func decodeUTF8(text []byte, part partial, buf []rune) ([]rune, partial, bool) {
	i := 0
	value, remain := part.value, part.remain
	for i < len(text) && text[i] != 0 && remain > 0 {
		if text[i]>>6 != 2 {
			return buf, partial{0, -1}, false
		}
		value = value<<6 + uint32(text[i]&0x3F)
		i++
		remain--
	}
	if part.remain > 0 && remain == 0 {
		buf = append(buf, rune(value))
	}
	for i < len(text) && text[i] != 0 {
		first := text[i]
		remain = utf8Len[first>>4] - 1
		if remain < 0 {
			return buf[:0], partial{0, remain}, false
		}
		value = uint32(first & (1<<(7-remain) - 1))
		i++
		for i < len(text) && text[i] != 0 && remain > 0 {
			value = value<<6 + uint32(text[i]&0x3F)
			i++
			remain--
		}
		if remain == 0 {
			buf = append(buf, rune(value))
		}
	}
	return buf, partial{value, remain}, true
}

// utf8Len is a sequence's length by the high nibble of its first byte (0:
// a continuation byte, which cannot start one).
var utf8Len = [16]int{1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4}

// matchesPartial is llama_grammar_match_partial_char: whether the
// unfinished sequence p can still finish as a character class e allows.
// For a negated class, llama.cpp asks that none of its ranges meets the
// code points p can finish as.
func (e elem) matchesPartial(p partial) bool {
	if p.remain < 0 || (p.remain == 1 && p.value < 2) {
		return false // invalid, or a 7-bit character in two bytes
	}
	low := p.value << (p.remain * 6)
	high := low | (1<<(p.remain*6) - 1)
	if low == 0 {
		switch p.remain {
		case 2:
			low = 1 << 11
		case 3:
			low = 1 << 16
		}
	}
	if e.negate && len(e.ranges) == 0 {
		return true // "."
	}
	for _, g := range e.ranges {
		if uint32(g.lo) <= high && low <= uint32(g.hi) {
			return !e.negate
		}
	}
	return e.negate
}
