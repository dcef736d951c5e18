package flagvocab

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// bindings are the flag package's methods that bind a flag to a variable
// (fs.IntVar(&o.Field, "name", …)).
var bindings = map[string]bool{"BoolVar": true, "IntVar": true, "Int64Var": true, "UintVar": true, "Uint64Var": true,
	"StringVar": true, "Float64Var": true, "DurationVar": true, "TextVar": true}

// Unread returns, for the Go files under dirs (test files, testdata and
// vendor-like trees aside), each flag bound to a struct field
// (fs.XxxVar(&x.Field, "name", …)) whose field no code reads: no other
// selector .Field in those files. It goes by field name, not type: a
// field named like one read elsewhere passes. Each problem reads
// "FILE:LINE: --NAME sets .Field, which nothing reads".
func Unread(dirs ...string) ([]string, error) {
	fset := token.NewFileSet()
	type bound struct {
		flag, field string
		pos         token.Position
	}
	var binds []bound
	uses := map[string]int{}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if n := d.Name(); n == "testdata" || n == "third_party" || strings.HasPrefix(n, ".") && path != dir {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					uses[n.Sel.Name]++
				case *ast.CallExpr:
					sel, ok := n.Fun.(*ast.SelectorExpr)
					if !ok || !bindings[sel.Sel.Name] || len(n.Args) < 2 {
						return true
					}
					addr, ok := n.Args[0].(*ast.UnaryExpr)
					if !ok || addr.Op != token.AND {
						return true
					}
					field, ok := addr.X.(*ast.SelectorExpr)
					lit, isLit := n.Args[1].(*ast.BasicLit)
					if !ok || !isLit || lit.Kind != token.STRING {
						return true
					}
					name, _ := strconv.Unquote(lit.Value)
					binds = append(binds, bound{flag: name, field: field.Sel.Name, pos: fset.Position(n.Pos())})
				}
				return true
			})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	var out []string
	for _, b := range binds {
		if uses[b.field] <= 1 { // the binding's own &x.Field
			out = append(out, fmt.Sprintf("%s:%d: --%s sets .%s, which nothing reads", b.pos.Filename, b.pos.Line, b.flag, b.field))
		}
	}
	sort.Strings(out)
	return out, nil
}
