package vocabcheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// home is the vocabulary's package, the one place its values are written.
const home = "pkg/wire/vocab"

// vocabConst matches the names of constants that are words of the
// vocabulary.
var vocabConst = regexp.MustCompile(`^(?i:mode|policy|finish|stamp)[A-Z]|^(?i:maxrequestid|defaultblocktokens)$`)

// coreDirs are the packages (and those under them) where a finish reason
// or a serving mode may not be spelled out.
var coreDirs = []string{"pkg/coordinator", "pkg/decode", "pkg/prefill", "pkg/budget"}

// stampNames are the wire names of the stamps: the enum's value names,
// lowercased, without the enum's prefix ("kv_done"); but "first_token",
// which is also the budget's term (and trace span) of the phase that
// ends with the first token.
func stampNames() []string {
	var out []string
	for n, name := range pdservev1.StampKind_name {
		if s := strings.ToLower(strings.TrimPrefix(name, "STAMP_KIND_")); n != 0 && s != "first_token" {
			out = append(out, s)
		}
	}
	return out
}

// copies returns "file:line: what" for each copy of the vocabulary in the
// Go source src of file (relative to the module root).
func copies(file string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	stamps := stampNames()
	core := false
	for _, d := range coreDirs {
		if strings.HasPrefix(file, d+"/") {
			core = true
		}
	}
	words := []string{vocab.FinishStop, vocab.FinishLength, vocab.ModeDisaggregated, vocab.ModeLocal}
	var bad []string
	at := func(n ast.Node, format string, args ...any) {
		bad = append(bad, fmt.Sprintf("%s: %s", fset.Position(n.Pos()), fmt.Sprintf(format, args...)))
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GenDecl:
			if n.Tok != token.CONST {
				return true
			}
			for _, spec := range n.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i < len(vs.Values) && vocabConst.MatchString(name.Name) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok {
							at(name, "constant %s = %s copies the wire vocabulary: name pkg/wire/vocab's", name.Name, lit.Value)
						}
					}
				}
			}
		case *ast.BasicLit:
			if n.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(n.Value)
			if err != nil {
				return true
			}
			if slices.Contains(stamps, s) {
				at(n, "%q spells a stamp: use vocab.Stamp…, which pkg/wire maps to pdservev1.StampKind", s)
			}
			if core && slices.Contains(words, s) {
				at(n, "%q spells a word of pkg/wire/vocab: name its constant", s)
			}
		}
		return true
	})
	return bad, nil
}

// TestOneVocabulary: no Go source of the module copies the wire
// vocabulary.
func TestOneVocabulary(t *testing.T) {
	root := repotest.Root(t)
	files := 0
	for _, dir := range []string{"pkg", "cmd", "internal", "loadtest"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				if rel == home || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") || strings.HasSuffix(rel, ".pb.go") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files++
			bad, err := copies(rel, src)
			if err != nil {
				return err
			}
			for _, b := range bad {
				t.Error(b)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files < 100 {
		t.Fatalf("read %d Go files under %s: the walk missed the module", files, root)
	}
}

// TestCopiesFound: the check finds each kind of copy, and passes the
// vocabulary's own names, comments and struct tags (whose text is not the
// bare word).
func TestCopiesFound(t *testing.T) {
	for _, tc := range []struct {
		file, src string
		want      int
	}{
		{"pkg/prefill/x.go", "package x\nconst maxRequestID = 255\n", 1},
		{"pkg/router/x.go", "package x\nconst DefaultBlockTokens = 16\n", 1},
		{"pkg/x/x.go", "package x\nconst ModeColocated = \"colocated\"\nconst PolicyDecode Policy = \"decode\"\n", 2},
		{"pkg/x/x.go", "package x\nconst FinishStop = \"stop\"\n", 1},
		{"pkg/x/x.go", "package x\nvar s = map[string]int{\"kv_done\": 1}\n", 1},
		{"pkg/coordinator/flow/x.go", "package x\nfunc f(s string) bool { return s == \"stop\" || s == \"local\" }\n", 2},
		{"pkg/frontend/x.go", "package x\nfunc f(s string) bool { return s == \"stop\" }\n", 0},
		{"pkg/x/x.go", "package x\nimport \"v\"\n// \"kv_done\" in a comment\nconst ModeColocated = v.ModeColocated\nconst maxRequestID = v.MaxRequestID\n", 0},
		{"pkg/x/x.go", "package x\ntype T struct{ A int `json:\"kv_done\"` }\n", 0},
	} {
		got, err := copies(tc.file, []byte(tc.src))
		if err != nil || len(got) != tc.want {
			t.Errorf("copies(%s, %q) = %q, %v; want %d", tc.file, tc.src, got, err, tc.want)
		}
	}
}
