package tokenizer

// Special token ids of the byte-level vocabulary.
const (
	BOS   int32 = 256
	EOS   int32 = 257
	Vocab       = 258
)

// Bytes is the byte-level tokenizer: token i < 256 is byte i. It is
// stateless and safe for concurrent use.
type Bytes struct{}

// Encode returns one token per byte of text, without BOS.
func (Bytes) Encode(text string) []int32 {
	ids := make([]int32, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = int32(text[i])
	}
	return ids
}

// Decode returns the bytes of ids as a string; special and out-of-range ids
// are skipped. The result may hold invalid UTF-8 when ids split a rune.
func (Bytes) Decode(ids []int32) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < 256 {
			b = append(b, byte(id))
		}
	}
	return string(b)
}

// DecodeToken returns the byte of id, or nil for special or invalid ids.
func (Bytes) DecodeToken(id int32) []byte {
	if id >= 0 && id < 256 {
		return []byte{byte(id)}
	}
	return nil
}

// EOS returns the end-of-sequence id.
func (Bytes) EOS() int32 { return EOS }

// Vocab returns the vocabulary size (258).
func (Bytes) Vocab() int { return Vocab }
