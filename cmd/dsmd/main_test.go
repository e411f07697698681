package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/dsmkit/dsm/node"
)

var update = flag.Bool("update", false, "rewrite the flag reference in docs/operations.md from dsmd --help")

const (
	opsDoc   = "../../docs/operations.md"
	refBegin = "<!-- BEGIN dsmd flags: made from dsmd --help by `go test ./cmd/dsmd -run TestOperationsDocFlags -update`; do not edit -->"
	refEnd   = "<!-- END dsmd flags -->"
)

// helpFlag is one flag as dsmd --help prints it.
type helpFlag struct {
	name, arg, what string
}

// helpFlags reads the flags from dsmd's help text (flag.PrintDefaults:
// "  -name ARG" then the description on lines indented by a tab).
func helpFlags(t *testing.T) []helpFlag {
	t.Helper()
	var b bytes.Buffer
	node.Usage(&b)
	var flags []helpFlag
	for _, l := range strings.Split(b.String(), "\n") {
		switch {
		case strings.HasPrefix(l, "  -"):
			name, arg, _ := strings.Cut(strings.TrimPrefix(l, "  -"), " ")
			flags = append(flags, helpFlag{name: name, arg: arg})
		case strings.HasPrefix(l, "    \t") && len(flags) > 0:
			f := &flags[len(flags)-1]
			f.what = strings.TrimSpace(f.what + " " + strings.TrimSpace(l))
		}
	}
	if len(flags) < 10 {
		t.Fatalf("read only %d flags from dsmd --help:\n%s", len(flags), b.String())
	}
	return flags
}

// configKeys are the JSON keys of node.Config (the --config file).
func configKeys() map[string]bool {
	keys := map[string]bool{}
	rt := reflect.TypeFor[node.Config]()
	for i := range rt.NumField() {
		if k, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ","); k != "" && k != "-" {
			keys[k] = true
		}
	}
	return keys
}

// reference is the Markdown table of every flag, with its --config key.
func reference(t *testing.T) string {
	t.Helper()
	keys := configKeys()
	var b strings.Builder
	fmt.Fprintln(&b, refBegin)
	fmt.Fprintln(&b, "| flag | key in the --config file | what it sets (and its default) |")
	fmt.Fprintln(&b, "| --- | --- | --- |")
	seen := map[string]bool{}
	for _, f := range helpFlags(t) {
		flagCol := "`--" + f.name + "`"
		if f.arg != "" {
			flagCol = "`--" + f.name + " " + f.arg + "`"
		}
		key := strings.ReplaceAll(f.name, "-", "_")
		keyCol := "`" + key + "`"
		switch {
		case f.name == "config":
			keyCol = "(command line only)"
		case !keys[key]:
			t.Fatalf("flag --%s has no key %q in the --config file (node.Config's json tags)", f.name, key)
		}
		seen[key] = true
		fmt.Fprintf(&b, "| %s | %s | %s |\n", flagCol, keyCol, strings.ReplaceAll(f.what, "|", `\|`))
	}
	for k := range keys {
		if !seen[k] {
			t.Errorf("the --config key %q has no flag of the same name", k)
		}
	}
	fmt.Fprint(&b, refEnd)
	return b.String()
}

// TestOperationsDocFlags: docs/operations.md documents every flag of dsmd,
// as dsmd --help says it, so the reference cannot drift from the binary.
// After changing a flag, run it with -update.
func TestOperationsDocFlags(t *testing.T) {
	b, err := os.ReadFile(opsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, refBegin), strings.Index(doc, refEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no flag reference between %q and %q", opsDoc, refBegin, refEnd)
	}
	want := reference(t)
	got := doc[i : j+len(refEnd)]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(opsDoc, []byte(doc[:i]+want+doc[j+len(refEnd):]), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the flag reference in %s", opsDoc)
		return
	}
	t.Fatalf("the flag reference in %s differs from dsmd --help; run go test ./cmd/dsmd -run TestOperationsDocFlags -update\n--- want:\n%s", opsDoc, want)
}
