package kubelet

import (
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The linkname in devicemanager.go binds to an unexported function by name only: the compiler
// cannot check its signature. This reads the function from the source the module cache holds
// for the pinned k8s.io/kubernetes and compares it, types and the packages they come from.
func TestNewManagerImplSignature(t *testing.T) {
	const pkg = "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	file := filepath.Join(strings.TrimSpace(string(out)), "manager.go")
	fset := token.NewFileSet()
	parsed, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	imports := map[string]string{}
	for _, spec := range parsed.Imports {
		path, _ := strconv.Unquote(spec.Path.Value)
		parts := strings.Split(path, "/")
		name := parts[len(parts)-1]
		if len(parts) > 1 && regexp.MustCompile(`^v[0-9]+$`).MatchString(name) {
			name = parts[len(parts)-2] // k8s.io/klog/v2 is package klog
		}
		if spec.Name != nil {
			name = spec.Name.Name
		}
		imports[name] = path
	}
	var found *ast.FuncDecl
	for _, decl := range parsed.Decls {
		if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == "newManagerImpl" {
			found = fn
		}
	}
	if found == nil {
		t.Fatalf("%s has no newManagerImpl any more: devicemanager.go's go:linkname needs another way in", file)
	}
	// each type spelled with its package's import path, so a renamed import cannot hide another type
	var spell func(ast.Expr) string
	spell = func(e ast.Expr) string {
		switch e := e.(type) {
		case *ast.Ident:
			return e.Name
		case *ast.SelectorExpr:
			if x, ok := e.X.(*ast.Ident); ok {
				return imports[x.Name] + "." + e.Sel.Name
			}
		case *ast.StarExpr:
			return "*" + spell(e.X)
		case *ast.ArrayType:
			if e.Len == nil {
				return "[]" + spell(e.Elt)
			}
		}
		var b strings.Builder
		_ = printer.Fprint(&b, fset, e)
		return b.String()
	}
	render := func(fields *ast.FieldList) []string {
		var types []string
		for _, field := range fields.List {
			for range max(1, len(field.Names)) {
				types = append(types, spell(field.Type))
			}
		}
		return types
	}
	got := strings.Join(render(found.Type.Params), ", ") + " -> " + strings.Join(render(found.Type.Results), ", ")
	want := "k8s.io/klog/v2.Logger, string, []github.com/google/cadvisor/info/v1.Node, " +
		"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager.Store -> *ManagerImpl, error"
	if got != want {
		t.Fatalf("newManagerImpl in %s is now\n  %s\nwhile devicemanager.go declares\n  %s\n"+
			"fix: make the go:linkname declaration match before running anything that starts a device manager",
			file, got, want)
	}
}
