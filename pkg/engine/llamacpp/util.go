package llamacpp

import "runtime"

// keepAlive keeps Go memory that C reads through addresses held in other
// memory (batch arrays, chat messages) alive until this point.
func keepAlive(xs ...any) {
	for _, x := range xs {
		runtime.KeepAlive(x)
	}
}
