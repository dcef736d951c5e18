//go:build ignore

// gen_llama_cases extracts the cases of llama.cpp's
// tests/test-json-schema-to-grammar.cpp (a schema, whether the converter
// accepts it, and the grammar it writes) into llama_cases.json, which
// TestLlamaCases reads. Run it by hand against the pinned release's
// source tree:
//
//	go run gen_llama_cases.go LLAMA_SRC/tests/test-json-schema-to-grammar.cpp COMMIT > llama_cases.json
//
// The cases are llama.cpp's (MIT License, Copyright (c) 2023-2026 The ggml
// authors); the output keeps that notice.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
)

type tcase struct {
	Name    string `json:"name"`
	Accepts bool   `json:"accepts"`
	Schema  string `json:"schema"`
	Grammar string `json:"grammar,omitempty"`
}

// A C++ argument is a raw string R"""(...)""" or a plain "..." literal.
const arg = `(?:R"""\((?s:(.*?))\)"""|"((?:[^"\\]|\\.)*)")`

var caseRE = regexp.MustCompile(`(?:test|run)\(\{\s*(SUCCESS|FAILURE),\s*"((?:[^"\\]|\\.)*)",\s*` + arg + `,\s*` + arg + `,?\s*\}\);`)

// trim is the test's own trim: surrounding blanks, and the indentation of
// every line.
func trim(s string) string {
	s = strings.TrimSpace(s)
	return regexp.MustCompile(`(^|\n)[ \t]+`).ReplaceAllString(s, "$1")
}

func unquote(s string) string {
	r := strings.NewReplacer(`\"`, `"`, `\\`, `\`, `\n`, "\n")
	return r.Replace(s)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: go run gen_llama_cases.go test-json-schema-to-grammar.cpp COMMIT")
		os.Exit(2)
	}
	src, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var cases []tcase
	for _, m := range caseRE.FindAllStringSubmatch(string(src), -1) {
		schema := m[3]
		if schema == "" {
			schema = unquote(m[4])
		}
		grammar := m[5]
		if grammar == "" {
			grammar = unquote(m[6])
		}
		cases = append(cases, tcase{Name: unquote(m[2]), Accepts: m[1] == "SUCCESS", Schema: schema, Grammar: trim(grammar)})
	}
	out := struct {
		Source  string  `json:"source"`
		License string  `json:"license"`
		Cases   []tcase `json:"cases"`
	}{
		Source:  "llama.cpp tests/test-json-schema-to-grammar.cpp at commit " + os.Args[2] + ", extracted by gen_llama_cases.go",
		License: "MIT License. Copyright (c) 2023-2026 The ggml authors. Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated documentation files (the \"Software\"), to deal in the Software without restriction, including without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is furnished to do so, subject to the following conditions: The above copyright notice and this permission notice shall be included in all copies or substantial portions of the Software. THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.",
		Cases:   cases,
	}
	e := json.NewEncoder(os.Stdout)
	e.SetIndent("", "  ")
	e.SetEscapeHTML(false)
	if err := e.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
