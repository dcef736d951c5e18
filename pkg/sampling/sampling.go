package sampling

// Sampling selects how the next token is chosen. The zero value is greedy.
type Sampling struct {
	Temperature float32 // 0 means greedy (argmax); must be ≥ 0
	TopP        float32 // nucleus mass in (0, 1]; 0 is treated as 1
	Seed        uint64  // per-request seed; draws depend only on (Seed, position)
	// Penalties, when not nil, lower the logits of tokens already generated
	// (OpenAI's presence_penalty and frequency_penalty) before the token is
	// chosen. The caller owns it and updates its counts between steps; the
	// engine only reads it during a call.
	Penalties *Penalties
	// Constraint, when not nil, restricts the tokens that may be chosen
	// (grammar-constrained decoding): engine.Sample masks the (penalised)
	// logits with it before choosing. The caller owns it and advances it
	// over each chosen token between steps; the engine only calls Mask.
	Constraint Constraint
	// Grammar is the GBNF text (root rule "root") of the constraint, as it
	// travels to the workers (structured output); "" when unconstrained.
	// Engines read Constraint only: a worker builds Constraint from
	// Grammar (pkg/grammar) and keeps it advanced.
	Grammar string
}

// Constraint is the per-sequence state of a decoding constraint.
type Constraint interface {
	// Mask sets to -Inf the logit of every token not allowed next.
	// logits holds one value per vocabulary id.
	Mask(logits []float32)
}

// Penalties are OpenAI's repetition penalties over a sequence's output
// tokens (not its prompt): the logit of token t is lowered by
// Frequency × count(t) + Presence × [count(t) > 0] before sampling. Both
// lie in [-2, 2]. Not safe for concurrent use.
type Penalties struct {
	Presence, Frequency float32
	// Counts maps an output token id to the number of times it was
	// generated so far.
	Counts map[int32]int32
}

// Active reports whether p changes any logit.
func (p *Penalties) Active() bool {
	return p != nil && (p.Presence != 0 || p.Frequency != 0) && len(p.Counts) > 0
}

// Add counts tokens as generated.
func (p *Penalties) Add(tokens ...int32) {
	if p == nil {
		return
	}
	if p.Counts == nil {
		p.Counts = make(map[int32]int32)
	}
	for _, t := range tokens {
		p.Counts[t]++
	}
}

// TokenLogprob is the log-probability of one token under the model's
// distribution at its position (natural log of the softmax of the raw
// logits: before temperature, top-p or penalties, as vLLM's default
// "raw_logprobs"), with the Top most probable alternatives.
type TokenLogprob struct {
	Token   int32
	Logprob float32
	// Top holds the most probable tokens at that position, most probable
	// first (ties by id), as many as asked; it may include Token.
	Top []TokenProb
}

// TokenProb is one alternative of a TokenLogprob.
type TokenProb struct {
	Token   int32
	Logprob float32
}

// MaxTopLogprobs is the most alternatives a TokenLogprob carries (OpenAI's
// top_logprobs limit).
const MaxTopLogprobs = 20
