package executor

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// receiverType is the type name of fn's receiver, "" for a function.
func receiverType(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return ""
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// The runner is the only code that reaches the tracer: only the runner's
// constructors build one, only runner (and tracer) methods read a
// runner's tracer, and no function takes one as a parameter, so every
// state change of a run, cold, warm, kept or recovered, leaves through
// the runner's one tracer.
func TestOnlyTheRunnerCallsTheTracer(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	constructors := map[string]bool{"newRunner": true, "keptRunner": true}
	fset := token.NewFileSet()
	var offenders []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			recv := receiverType(fn)
			if recv == "runner" || recv == "tracer" {
				continue
			}
			where := name + ":" + fn.Name.Name
			for _, p := range fn.Type.Params.List {
				if s, ok := p.Type.(*ast.StarExpr); ok {
					if id, ok := s.X.(*ast.Ident); ok && id.Name == "tracer" {
						offenders = append(offenders, where+" takes a *tracer")
					}
				}
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CompositeLit:
					if id, ok := n.Type.(*ast.Ident); ok && id.Name == "tracer" && !constructors[fn.Name.Name] {
						offenders = append(offenders, where+" builds a tracer")
					}
				case *ast.SelectorExpr:
					if n.Sel.Name == "tr" && !constructors[fn.Name.Name] {
						offenders = append(offenders, where+" reads a runner's tracer")
					}
				}
				return true
			})
		}
	}
	assert.Empty(t, offenders)
}
