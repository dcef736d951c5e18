package grammar

import (
	"errors"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine/ref"
)

// A grammar not compiled within the time budget is refused with a
// *LimitError naming it; within it, the same grammar compiles.
func TestCompileTime(t *testing.T) {
	e, err := ref.New(ref.Options{Preset: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	src := ForEngine(e)
	_, err = src.compile(JSONObject, 0)
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "compile milliseconds" {
		t.Fatalf("compile with no time: %v, want the compile milliseconds limit", err)
	}
	c, err := src.compile(JSONObject, CompileTime)
	if err != nil || c.start == nil {
		t.Fatalf("compile: %v, start %v", err, c)
	}
}
