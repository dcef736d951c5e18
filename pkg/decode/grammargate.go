package decode

import "runtime"

// grammarWorkers is the goroutines of a decode worker's grammar.Offload
// (its batch's Config.Grammars): a quarter of the CPUs, at least one, so
// that grammar work leaves the engine most of them.
func grammarWorkers() int { return max(1, runtime.GOMAXPROCS(0)/4) }
