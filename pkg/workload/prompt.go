package workload

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Tokenizer names how prompt tokens are counted and synthesised.
type Tokenizer int

const (
	// Bytes is a byte-level tokenizer: one token per byte (pdserve's
	// built-in models). Text prompts have exactly the asked token count.
	Bytes Tokenizer = iota
	// Approx approximates a BPE tokenizer (GPT, Llama, OPT): synthesised
	// text uses one common English word per token, which such tokenizers
	// encode as one token each (within about ±10%), and the token count of
	// real text is ceil(bytes / 4), the usual rule of thumb for English.
	Approx
)

// String returns the flag spelling: "bytes" or "approx".
func (t Tokenizer) String() string {
	if t == Approx {
		return "approx"
	}
	return "bytes"
}

// ParseTokenizer parses "bytes" or "approx".
func ParseTokenizer(s string) (Tokenizer, error) {
	switch s {
	case "bytes":
		return Bytes, nil
	case "approx":
		return Approx, nil
	}
	return 0, fmt.Errorf("%w: tokenizer %q: want bytes or approx", ErrBadOption, s)
}

// Count returns the token count of text under t.
func (t Tokenizer) Count(text string) int {
	if t == Approx {
		return (len(text) + 3) / 4
	}
	return len(text)
}

// Format names how a prompt is sent.
type Format int

const (
	// Text sends the prompt as a string.
	Text Format = iota
	// Tokens sends the prompt as an array of token ids (OpenAI's
	// /v1/completions accepts it; exact lengths on any tokenizer).
	Tokens
)

// String returns the flag spelling: "text" or "tokens".
func (f Format) String() string {
	if f == Tokens {
		return "tokens"
	}
	return "text"
}

// ParseFormat parses "text" or "tokens".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "text":
		return Text, nil
	case "tokens":
		return Tokens, nil
	}
	return 0, fmt.Errorf("%w: prompt format %q: want text or tokens", ErrBadOption, s)
}

// words are short, common English words; each is a single token (with its
// leading space) in the GPT-2, Llama and OPT vocabularies.
var words = strings.Fields(`the of and to in is it you that was for on are with as
his they be at one have this from or had by word but what some we can out other
were all there when up use your how said an each she which do their time if will
way about many then them write would like so these her long make thing see him two
has look more day could go come did number sound no most people my over know water
than call first who may down side been now find any new work part take get place
made live where after back little only round man year came show every good me give
our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three
want air well also play small end put home read hand port large spell add even land
here must big high such follow act why ask men change went light kind off need
house picture try us again animal point mother world near build self earth father
head stand own page should country found answer school grow study still learn plant
cover food sun four between state keep eye never last let thought city tree cross
farm hard start might story saw far sea draw left late run while press close night
real life few north open seem together next white children begin got walk example
ease paper group always music those both mark often letter until mile river car
feet care second book carry took science eat room friend began idea fish mountain
stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family
direct pose leave song measure door product black short numeral class wind question
happen complete ship area half rock order fire south problem piece told knew pass
since top whole king space heard best hour better true during hundred five remember
step early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow center
love person money serve appear road map rain rule govern pull cold notice voice unit
power town fine certain fly fall lead cry dark machine note wait plan figure star
box noun field rest correct able pound done beauty drive stood contain front teach
week final gave green quick develop ocean warm free minute strong special mind
behind clear tail produce fact street inch multiply nothing course stay wheel full
force blue object decide surface deep moon island foot system busy test record boat
common gold possible plane stead dry wonder laugh thousand ago ran check game shape
equate hot miss brought heat snow tire bring yes distant fill east paint language
among`)

// Synth synthesises prompt content of a given token count. The zero value
// makes byte-level text. A Synth is read only after setup and safe for
// concurrent use; each call takes its own random source.
type Synth struct {
	Format    Format
	Tokenizer Tokenizer
	// IDLo and IDHi bound the token ids drawn for Tokens prompts on the
	// Approx tokenizer: ids are uniform in [IDLo, IDHi). Zero values mean
	// [1000, 10000), valid in any vocabulary of at least 10,000 tokens.
	// Byte-level token prompts always use the bytes of the text a Text
	// prompt would have, so both formats send the same tokens.
	IDLo, IDHi int32
}

// Validate reports a bad id range.
func (s Synth) Validate() error {
	lo, hi := s.idRange()
	if lo < 0 || hi <= lo {
		return fmt.Errorf("%w: token id range [%d, %d) is empty", ErrBadOption, lo, hi)
	}
	return nil
}

func (s Synth) idRange() (int32, int32) {
	if s.IDLo == 0 && s.IDHi == 0 {
		return 1000, 10000
	}
	return s.IDLo, s.IDHi
}

// Prompt accumulates synthesised content. The zero value is empty.
type Prompt struct {
	text []byte
	ids  []int32
	n    int
}

// Len returns the number of tokens appended so far.
func (p *Prompt) Len() int { return p.n }

// Append adds n tokens of content drawn from rng (n ≤ 0 adds nothing).
func (s Synth) Append(p *Prompt, rng *rand.Rand, n int) {
	if n <= 0 {
		return
	}
	p.n += n
	switch {
	case s.Tokenizer == Bytes:
		// Words joined by spaces, cut to exactly n bytes. As tokens, the
		// ids are the bytes.
		buf := make([]byte, 0, n+16)
		for len(buf) < n {
			if len(buf) > 0 {
				buf = append(buf, ' ')
			}
			buf = append(buf, words[rng.IntN(len(words))]...)
		}
		p.text = append(p.text, buf[:n]...)
	case s.Format == Tokens:
		lo, hi := s.idRange()
		for range n {
			p.ids = append(p.ids, lo+rng.Int32N(hi-lo))
		}
	default:
		for range n {
			p.text = append(p.text, ' ')
			p.text = append(p.text, words[rng.IntN(len(words))]...)
		}
	}
}

// AppendText adds real text, counted by the tokenizer. With the Tokens
// format it needs the Bytes tokenizer (ids are bytes); it reports
// ErrBadOption otherwise.
func (s Synth) AppendText(p *Prompt, text string) error {
	if s.Format == Tokens && s.Tokenizer != Bytes {
		return fmt.Errorf("%w: real text as token ids needs --tokenizer bytes", ErrBadOption)
	}
	p.text = append(p.text, text...)
	p.n += s.Tokenizer.Count(text)
	return nil
}

// body returns p as text (Text format) or token ids (Tokens format).
func (s Synth) body(p *Prompt) (string, []int32) {
	if s.Format == Text {
		return string(p.text), nil
	}
	if s.Tokenizer == Bytes {
		ids := make([]int32, len(p.text))
		for i, b := range p.text {
			ids[i] = int32(b)
		}
		return "", ids
	}
	return "", append([]int32(nil), p.ids...)
}

// newRand returns a PCG source for (seed, stream); streams keep independent
// draws (lengths, content, arrivals) from shifting one another.
func newRand(seed, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream))
}

// Random-stream identifiers.
const (
	streamLengths uint64 = 0x6c656e73 + iota
	streamContent
	streamPrefix
	streamShuffle
	streamBlock
)
