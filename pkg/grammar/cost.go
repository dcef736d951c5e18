package grammar

// CostBytes is the grammar text one token of a key's rate limit pays
// for, per choice decoded under it (CostTokens).
const CostBytes = 256

// CostTokens is what a grammar costs each choice decoded under it, in
// tokens of a key's tokens-a-minute limit: one per CostBytes of its GBNF
// text, rounded up (0 for none). Its compile and mask work grow with its
// size (its states, which DefaultLimits bounds with its bytes), and
// each choice keeps a state of its own, so a client pays for the
// grammar's size times n, and cannot make the workers' grammar work
// grow past its limit by a large grammar on a small max_tokens. The
// largest grammar (MaxBytes) costs 4,096 tokens a choice.
func CostTokens(gbnf string) int { return (len(gbnf) + CostBytes - 1) / CostBytes }
