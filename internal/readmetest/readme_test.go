//go:build unix

package readmetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/repotest"
)

// block is one fenced code block of a Markdown file.
type block struct {
	file   string // relative to the repository root
	line   int    // of the opening fence, from 1
	lang   string
	marker string // the recipe comment before the fence, "" when none
	text   string // the block's lines, indentation removed
}

func (b block) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

var (
	fenceRE  = regexp.MustCompile("^(\\s*)```\\s*([A-Za-z0-9_-]*)\\s*$")
	markerRE = regexp.MustCompile(`^\s*<!--\s*(recipe(?::[^>]*)?)\s*-->\s*$`)
	skipRE   = regexp.MustCompile(`^recipe: skip \((.+)\)$`)
)

// parseBlocks returns the fenced blocks of a Markdown file.
func parseBlocks(file string, data []byte) ([]block, error) {
	var (
		out      []block
		cur      *block
		curLines []string
		indent   string
		prev     string // the last non-blank line outside blocks
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if cur == nil {
			if m := fenceRE.FindStringSubmatch(line); m != nil {
				cur = &block{file: file, line: n, lang: m[2]}
				if mm := markerRE.FindStringSubmatch(prev); mm != nil {
					cur.marker = strings.TrimSpace(mm[1])
				}
				indent, curLines = m[1], nil
				continue
			}
			if strings.TrimSpace(line) != "" {
				prev = line
			}
			continue
		}
		if strings.TrimSpace(line) == "```" {
			cur.text = strings.Join(curLines, "\n")
			out = append(out, *cur)
			cur, prev = nil, ""
			continue
		}
		curLines = append(curLines, strings.TrimPrefix(line, indent))
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: unclosed code block", file, cur.line)
	}
	return out, sc.Err()
}

// docFiles are the files whose shell blocks must be marked: README.md and
// docs/*.md.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range more {
		files = append(files, filepath.Join("docs", filepath.Base(f)))
	}
	return files
}

func isShell(lang string) bool { return lang == "sh" || lang == "bash" || lang == "shell" }

// recipes returns the runnable recipes of the files, each a list of
// blocks (a recipe and its continuations), and fails the test for a shell
// block without a marker, a skip without a reason or a continuation
// without a recipe before it.
func recipes(t *testing.T, root string) [][]block {
	t.Helper()
	var out [][]block
	for _, f := range docFiles(t, root) {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := parseBlocks(f, data)
		if err != nil {
			t.Fatal(err)
		}
		last := -1 // index in out of this file's last recipe
		for _, b := range blocks {
			switch {
			case b.marker == "" && isShell(b.lang):
				t.Errorf("%v: a %s block without <!-- recipe --> or <!-- recipe: skip (reason) --> before its fence", b, b.lang)
			case b.marker == "":
			case b.marker == "recipe":
				out = append(out, []block{b})
				last = len(out) - 1
			case b.marker == "recipe: continued":
				if last < 0 {
					t.Errorf("%v: <!-- recipe: continued --> with no recipe before it in %s", b, f)
					continue
				}
				out[last] = append(out[last], b)
			case skipRE.MatchString(b.marker):
				last = -1
			default:
				t.Errorf("%v: marker %q: want recipe, recipe: continued or recipe: skip (reason)", b, b.marker)
			}
			if b.marker != "" && !isShell(b.lang) {
				t.Errorf("%v: a recipe marker on a %q block; recipes are sh blocks", b, b.lang)
			}
		}
	}
	return out
}

// TestEveryShellBlockIsMarked checks the markers alone, without running
// anything.
func TestEveryShellBlockIsMarked(t *testing.T) {
	root := repotest.Root(t)
	if len(recipes(t, root)) == 0 {
		t.Error("no recipe found")
	}
}

// TestParseBlocks checks the parser on markers, indentation and
// continuations.
func TestParseBlocks(t *testing.T) {
	md := "text\n\n<!-- recipe -->\n```sh\necho a\n```\n\n- item\n\n  <!-- recipe: skip (needs a GPU) -->\n  ```sh\n  nvidia-smi \\\n    -L\n  ```\n```json\n{}\n```\n"
	bs, err := parseBlocks("x.md", []byte(md))
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 3 {
		t.Fatalf("%d blocks, want 3: %+v", len(bs), bs)
	}
	if bs[0].marker != "recipe" || bs[0].text != "echo a" || bs[0].line != 4 {
		t.Errorf("block 0: %+v", bs[0])
	}
	if m := skipRE.FindStringSubmatch(bs[1].marker); m == nil || m[1] != "needs a GPU" || bs[1].text != "nvidia-smi \\\n  -L" {
		t.Errorf("block 1: %+v", bs[1])
	}
	if bs[2].marker != "" || bs[2].lang != "json" {
		t.Errorf("block 2: %+v", bs[2])
	}
	cmds := commands("a \\\n  b  # it's a comment\n# only a comment\n\nc -d '{\n  \"x\": 1}'\nd")
	if len(cmds) != 3 || cmds[0] != "a \\\n  b  # it's a comment" || cmds[1] != "c -d '{\n  \"x\": 1}'" || cmds[2] != "d" {
		t.Errorf("commands: %q", cmds)
	}
}

// commands splits a shell block into commands: lines joined where they end
// with a backslash or inside a quoted string, comment-only and blank lines
// dropped.
func commands(text string) []string {
	var out []string
	var cur []string
	var quote byte // the open quote, 0 when none
	for _, line := range strings.Split(text, "\n") {
		if len(cur) == 0 {
			if s := strings.TrimSpace(line); s == "" || strings.HasPrefix(s, "#") {
				continue
			}
		}
		cur = append(cur, line)
		quote = scanQuotes(line, quote)
		if quote == 0 && !strings.HasSuffix(strings.TrimRight(line, " \t"), "\\") {
			out = append(out, strings.Join(cur, "\n"))
			cur = nil
		}
	}
	if len(cur) > 0 {
		out = append(out, strings.Join(cur, "\n"))
	}
	return out
}

// scanQuotes returns the quote still open at the end of line, given the
// one open at its start: ' and " as the shell reads them, a backslash
// escaping the next byte outside single quotes, and a # outside quotes
// starting a comment.
func scanQuotes(line string, quote byte) byte {
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			}
		case c == '\\':
			i++
		case quote == '"':
			if c == '"' {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return 0
		}
	}
	return quote
}

// env is what every recipe shares: the built binaries, the go.mod tools,
// the test model and the ports handed out.
type env struct {
	root, bin string
	tmp       string // the test's own directory for the model
	gguf      string // a tiny-llama GGUF, "" before the first llama recipe needs it
	ggufOnce  sync.Once
	ggufErr   error

	binDone chan struct{} // closed when the binaries are built
	binErr  error
	tools   map[string]*toolBuild // by name, each go.mod tool a recipe runs

	portMu sync.Mutex
	ports  map[string]bool // handed out to a recipe, never again
}

// toolBuild is the build of one go.mod tool into env.bin, which the
// recipe's go tool NAME is rewritten to.
type toolBuild struct {
	done chan struct{}
	err  error
}

// requireTool fails under CI=true, else skips, when name is not on PATH.
func requireTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed: the README's recipes need it", name)
		}
		t.Skipf("%s is not installed: recipe skipped", name)
	}
}

// goToolRE matches a run of a go.mod tool: go tool NAME.
var goToolRE = regexp.MustCompile(`(^|[\s;|&(])go tool ([a-z][a-z0-9-]*)\b`)

// goTools returns the go.mod tools the recipes run, each once.
func goTools(all ...[]block) []string {
	var names []string
	for _, r := range all {
		for _, b := range r {
			for _, m := range goToolRE.FindAllStringSubmatch(b.text, -1) {
				if !slices.Contains(names, m[2]) {
					names = append(names, m[2])
				}
			}
		}
	}
	return names
}

var toolRE = regexp.MustCompile(`(^|[\s;|&(])(curl|openssl|taskset)\s`)

// maxRecipes is how many recipes run at once: one. Four at once, beside
// a loaded machine (load average 40 on 2 cores), ran coordinator plan and
// the three-process recipe past their two minutes; the recipes still run
// while the go.mod tools build.
const maxRecipes = 1

// envTools, set to 1, runs the recipes that run a go.mod tool (go tool
// helm) and only those: `make test-readme-tools`, which CI runs in its
// chart step, where Helm is built anyway. Unset (make test), those
// recipes are left out (the log names them) and every other one runs: building Helm (360
// packages beyond what the tests compile) under -race added 46 s to a
// cold make test.
const envTools = "PDSERVE_TEST_README_TOOLS"

// toolsMode reads envTools: whether this run is the go.mod tools' one.
func toolsMode(t *testing.T) bool {
	t.Helper()
	switch v := os.Getenv(envTools); v {
	case "1":
		return true
	case "":
		return false
	default:
		t.Fatalf("%s=%q: want 1 (the tool recipes only) or unset (every other recipe)", envTools, v)
		return false
	}
}

// TestReadmeRecipes runs every recipe, maxRecipes at a time: each in a
// directory of its own, on ports of its own. The recipes that run a
// go.mod tool run only with envTools set, and then alone.
func TestReadmeRecipes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the recipes build and start the binaries")
	}
	root := repotest.Root(t)
	all := recipes(t, root)
	if t.Failed() {
		t.FailNow()
	}
	paths, err := modTools(root)
	if err != nil {
		t.Fatal(err)
	}
	tools := toolsMode(t)
	var others []string // the recipes this run leaves to the other
	selected := all[:0:0]
	for _, r := range all {
		if (len(modToolsRun(paths, r)) > 0) == tools {
			selected = append(selected, r)
		} else {
			others = append(others, r[0].String())
		}
	}
	if len(selected) == 0 {
		t.Fatalf("no recipe to run with %s=%q", envTools, os.Getenv(envTools))
	}
	if tools {
		t.Logf("%d recipes run by go.mod tools; the %d others run in make test", len(selected), len(others))
	} else if len(others) > 0 {
		t.Logf("%d recipes run a go.mod tool and run in `make test-readme-tools`: %s", len(others), strings.Join(others, ", "))
	}
	e := &env{root: root, bin: t.TempDir(), tmp: t.TempDir(), ports: map[string]bool{}}
	e.build(t, paths, !tools || runsRepo(selected), goTools(selected...))
	sem := make(chan struct{}, maxRecipes)
	var wg sync.WaitGroup
	for _, r := range selected {
		sem <- struct{}{}
		// t.Run from a goroutine of its own: the recipes run at once
		// without t.Parallel, whose limit is the cores (-parallel).
		wg.Go(func() {
			defer func() { <-sem }()
			t.Run(strings.ReplaceAll(r[0].String(), "/", "_"), func(t *testing.T) {
				var text strings.Builder
				for _, b := range r {
					text.WriteString(b.text + "\n")
				}
				s := text.String()
				for _, m := range toolRE.FindAllStringSubmatch(s, -1) {
					requireTool(t, m[2])
				}
				if needsLlama(s) {
					repotest.Llama(t)
				}
				e.waitBuilt(t, goTools(r))
				runRecipe(t, e, r)
			})
		})
	}
	wg.Wait()
}

// build builds, in the background, the binaries that stand in for go run
// and for go tool: first the repository's when repo is set (with -race
// under -race, to reuse what go test -race compiled), then each go.mod
// tool of paths that the recipes run (go tool helm, …) from the package
// go.mod names, with the same flags, so that it reuses what those builds
// and the tests compiled. A recipe waits for what it runs (waitBuilt),
// and no build counts against a block's two minutes (on a cold build
// cache building Helm alone took longer than that).
func (e *env) build(t *testing.T, paths []string, repo bool, tools []string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	goBuild := func(pkgs ...string) error {
		start := time.Now()
		args := repotest.BuildArgs(e.bin, pkgs...)
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = e.root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("go %s: %.1fs", strings.Join(args, " "), time.Since(start).Seconds())
		return nil
	}
	e.binDone = make(chan struct{})
	e.tools = map[string]*toolBuild{}
	pkgs := map[string]string{} // tool name → package
	for _, name := range tools {
		for _, p := range paths {
			if path.Base(p) == name {
				pkgs[name] = p
				e.tools[name] = &toolBuild{done: make(chan struct{})}
			}
		}
	}
	go func() {
		defer close(done)
		if repo {
			e.binErr = goBuild("./cmd/coordinator", "./cmd/prefill-worker", "./cmd/decode-worker", "./cmd/mkgguf", "./loadtest")
		}
		close(e.binDone)
		for _, name := range tools {
			if tb := e.tools[name]; tb != nil {
				tb.err = goBuild(pkgs[name])
				close(tb.done)
			}
		}
	}()
}

// runsRepo reports whether a recipe of rs runs one of the repository's
// binaries (go run).
func runsRepo(rs [][]block) bool {
	for _, r := range rs {
		for _, b := range r {
			if strings.Contains(b.text, "go run ") {
				return true
			}
		}
	}
	return false
}

// modToolsRun returns the go.mod tools (of paths) that recipe r runs.
func modToolsRun(paths []string, r []block) []string {
	var run []string
	for _, name := range goTools(r) {
		for _, p := range paths {
			if path.Base(p) == name {
				run = append(run, name)
			}
		}
	}
	return run
}

// modTools returns the package paths of go.mod's tool directives; go tool
// NAME runs the one whose last element is NAME.
func modTools(root string) ([]string, error) {
	cmd := exec.Command("go", "mod", "edit", "-json")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod edit -json: %w", err)
	}
	var mod struct{ Tool []struct{ Path string } }
	if err := json.Unmarshal(out, &mod); err != nil {
		return nil, fmt.Errorf("go mod edit -json: %w", err)
	}
	var paths []string
	for _, tl := range mod.Tool {
		paths = append(paths, tl.Path)
	}
	return paths, nil
}

// waitBuilt waits until the binaries and the named go.mod tools are
// built, and fails the test when one of their builds failed.
func (e *env) waitBuilt(t *testing.T, tools []string) {
	t.Helper()
	<-e.binDone
	if e.binErr != nil {
		t.Fatal(e.binErr)
	}
	for _, name := range tools {
		tb := e.tools[name]
		if tb == nil {
			continue // not a go.mod tool (go tool pprof): run as written
		}
		<-tb.done
		if tb.err != nil {
			t.Fatal(tb.err)
		}
	}
}

func needsLlama(s string) bool {
	return strings.Contains(s, "llamacpp") || strings.Contains(s, "mkgguf") || strings.Contains(s, ".gguf") || strings.Contains(s, "make llama")
}

// testGGUF writes the tiny-llama model the recipes serve as their.gguf,
// once.
func (e *env) testGGUF(t *testing.T) string {
	t.Helper()
	e.ggufOnce.Do(func() {
		e.gguf = filepath.Join(e.tmp, "their.gguf")
		cmd := exec.Command(filepath.Join(e.bin, "mkgguf"), "--shape", "tiny-llama", "--type", "f16", "--out", e.gguf)
		cmd.Dir = e.root
		if out, err := cmd.CombinedOutput(); err != nil {
			e.ggufErr = fmt.Errorf("mkgguf: %v\n%s", err, out)
		}
	})
	if e.ggufErr != nil {
		t.Fatal(e.ggufErr)
	}
	return e.gguf
}

// session is one recipe's run: its directory, ports and servers.
type session struct {
	t       *testing.T
	e       *env
	dir     string
	ports   map[string]string // README port → free port
	servers []*server
	pending []*server // started, not yet seen ready
}

type server struct {
	name  string
	cmd   *exec.Cmd
	out   *syncBuffer
	ready string // URL of /readyz
	done  chan struct{}
	err   error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newSession makes the recipe's directory: a link to every top-level entry
// of the repository but .pdserve, a tmp/ of its own, and their.gguf when
// the recipe names it.
func newSession(t *testing.T, e *env, text string) *session {
	s := &session{t: t, e: e, dir: t.TempDir(), ports: map[string]string{}}
	ents, err := os.ReadDir(e.root)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range ents {
		if n := de.Name(); n != ".pdserve" && n != ".git" {
			if err := os.Symlink(filepath.Join(e.root, n), filepath.Join(s.dir, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Mkdir(filepath.Join(s.dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text, "their.gguf") {
		if err := os.Symlink(e.testGGUF(t), filepath.Join(s.dir, "their.gguf")); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// freePort returns a port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// port returns the free port that stands for the README's port p in this
// recipe: the same for each mention, and one that no other recipe of the
// run was given (they run at once).
func (s *session) port(p string) string {
	if q, ok := s.ports[p]; ok {
		return q
	}
	e := s.e
	e.portMu.Lock()
	defer e.portMu.Unlock()
	for {
		q := freePort(s.t)
		if !e.ports[q] {
			e.ports[q] = true
			s.ports[p] = q
			return q
		}
	}
}

var (
	goRunRE = regexp.MustCompile(`\bgo run \./(cmd/[a-z-]+|loadtest)\b`)
	addrRE  = regexp.MustCompile(`\b(127\.0\.0\.1|localhost):([0-9]{2,5})\b`)
	tmpRE   = regexp.MustCompile(`(^|[\s=])/tmp/`)
)

// rewrite turns a README command into the one the test runs.
func (s *session) rewrite(c string) string {
	c = tmpRE.ReplaceAllString(c, "${1}"+s.dir+"/tmp/")
	c = goRunRE.ReplaceAllStringFunc(c, func(m string) string {
		return filepath.Join(s.e.bin, filepath.Base(strings.TrimPrefix(m, "go run ./")))
	})
	c = goToolRE.ReplaceAllStringFunc(c, func(m string) string {
		sm := goToolRE.FindStringSubmatch(m)
		if _, ok := s.e.tools[sm[2]]; !ok {
			return m
		}
		return sm[1] + filepath.Join(s.e.bin, sm[2])
	})
	c = addrRE.ReplaceAllStringFunc(c, func(m string) string {
		host, p, _ := strings.Cut(m, ":")
		return host + ":" + s.port(p)
	})
	if strings.TrimSpace(c) == "make llama" || strings.HasPrefix(strings.TrimSpace(c), "make llama ") {
		// Installed before the tests (repotest.Llama checked it).
		c = "test -d third_party/llama/lib"
	}
	return c
}

// serverKind says which server a command starts: "coordinator",
// "prefill-worker", "decode-worker", or "" for a command that ends.
func (s *session) serverKind(fields []string) string {
	if len(fields) == 0 {
		return ""
	}
	switch filepath.Base(fields[0]) {
	case "coordinator":
		if filepath.Dir(fields[0]) == s.e.bin && (len(fields) == 1 || strings.HasPrefix(fields[1], "-")) && !hasFlag(fields, "--help") {
			return "coordinator"
		}
	case "prefill-worker", "decode-worker":
		if filepath.Dir(fields[0]) == s.e.bin && !hasFlag(fields, "--help") {
			return filepath.Base(fields[0])
		}
	}
	return ""
}

func hasFlag(fields []string, name string) bool {
	return flagValue(fields, name) != "" || func() bool {
		for _, f := range fields {
			if f == name {
				return true
			}
		}
		return false
	}()
}

// flagValue returns the value of --name in fields ("--name v" or
// "--name=v"), or "".
func flagValue(fields []string, name string) string {
	for i, f := range fields {
		if f == name && i+1 < len(fields) {
			return fields[i+1]
		}
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return ""
}

// runRecipe runs the blocks of one recipe in order and stops its servers.
func runRecipe(t *testing.T, e *env, r []block) {
	var all strings.Builder
	for _, b := range r {
		all.WriteString(b.text + "\n")
	}
	s := newSession(t, e, all.String())
	defer s.stop()
	for _, b := range r {
		for _, c := range commands(b.text) {
			if !s.run(b, s.rewrite(c)) {
				return
			}
		}
	}
	s.waitReady(r[len(r)-1])
}

// run runs one command, or starts it when it is a server; it reports
// whether the recipe may go on.
func (s *session) run(b block, c string) bool {
	t := s.t
	fields := strings.Fields(strings.ReplaceAll(c, "\\\n", " "))
	if kind := s.serverKind(fields); kind != "" {
		return s.start(b, kind, c, fields)
	}
	if !s.waitReady(b) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", c)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("%v: %v\n$ %s\n%s%s", b, err, c, out, s.serverLogs())
		return false
	}
	t.Logf("%v: $ %s\n%s", b, c, truncate(string(out), 2000))
	return true
}

// start starts a server in the background, in a process group of its own,
// with a free listen address for each one it would take by default.
func (s *session) start(b block, kind, c string, fields []string) bool {
	t := s.t
	var extra []string
	addr := func(flag, readme string) string {
		if v := flagValue(fields, flag); v != "" {
			return v
		}
		a := "127.0.0.1:" + s.port(readme)
		extra = append(extra, flag, a)
		return a
	}
	var ready string
	switch kind {
	case "coordinator":
		ready = addr("--http-addr", "8080")
		if !hasFlag(fields, "--standalone") && !hasFlag(fields, "--nats-url") {
			addr("--nats-listen", "4222")
		}
	default:
		addr("--grpc-addr", "9000+"+strconv.Itoa(len(s.servers)))
		ready = addr("--metrics-addr", "9100+"+strconv.Itoa(len(s.servers)))
	}
	if len(extra) > 0 {
		c += " " + strings.Join(extra, " ")
	}
	srv := &server{name: fmt.Sprintf("%s (%v)", kind, b), out: &syncBuffer{}, ready: "http://" + ready + "/readyz", done: make(chan struct{})}
	srv.cmd = exec.Command("bash", "-c", "exec "+c)
	srv.cmd.Dir = s.dir
	srv.cmd.Stdout, srv.cmd.Stderr = srv.out, srv.out
	srv.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := srv.cmd.Start(); err != nil {
		t.Errorf("%v: start %s: %v", b, c, err)
		return false
	}
	t.Logf("%v: started in the background: %s", b, c)
	go func() {
		srv.err = srv.cmd.Wait()
		close(srv.done)
	}()
	s.servers = append(s.servers, srv)
	s.pending = append(s.pending, srv)
	return true
}

// waitReady waits until every server started since the last wait answers
// /readyz with 200; it fails the recipe when one exits or does not get
// ready within two minutes (llama.cpp loads its model first).
func (s *session) waitReady(b block) bool {
	t := s.t
	deadline := time.Now().Add(2 * time.Minute)
	for _, srv := range s.pending {
		for {
			select {
			case <-srv.done:
				t.Errorf("%v: %s exited before it was ready: %v%s", b, srv.name, srv.err, s.serverLogs())
				return false
			default:
			}
			if ok, _ := get(srv.ready); ok {
				break
			}
			if time.Now().After(deadline) {
				_, why := get(srv.ready)
				t.Errorf("%v: %s not ready after 2m: %s%s", b, srv.name, why, s.serverLogs())
				return false
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	s.pending = nil
	return true
}

func get(url string) (bool, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	return resp.StatusCode == http.StatusOK, resp.Status + ": " + strings.TrimSpace(body.String())
}

// stop stops every server (SIGTERM to its group, SIGKILL after 20 s) and
// checks that it was still running, exited, and left no process behind.
func (s *session) stop() {
	t := s.t
	for _, srv := range s.servers {
		select {
		case <-srv.done:
			if !t.Failed() {
				t.Errorf("%s exited before the recipe ended: %v\n%s", srv.name, srv.err, truncate(srv.out.String(), 4000))
			}
		default:
		}
		pgid := srv.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-srv.done:
		case <-time.After(20 * time.Second):
			t.Errorf("%s did not stop within 20 s of SIGTERM: killed", srv.name)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-srv.done
		}
		// The group must be gone: no child outlives its server.
		for i := 0; ; i++ {
			err := syscall.Kill(-pgid, 0)
			if errors.Is(err, syscall.ESRCH) {
				break
			}
			if i == 50 {
				t.Errorf("%s left processes in its group %d behind: killed", srv.name, pgid)
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func (s *session) serverLogs() string {
	var b strings.Builder
	for _, srv := range s.servers {
		fmt.Fprintf(&b, "\n--- %s:\n%s", srv.name, truncate(srv.out.String(), 4000))
	}
	return b.String()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.+?)\s*$`)
	slugDrop  = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// anchors returns the GitHub anchors of a Markdown file's headings.
func anchors(data []byte) map[string]bool {
	out := map[string]bool{}
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		if fenceRE.MatchString(line) {
			in = !in
			continue
		}
		if m := headingRE.FindStringSubmatch(line); m != nil && !in {
			slug := strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
			out[slug] = true
		}
	}
	return out
}

// TestRelativeLinks checks that every relative link of README.md,
// docs/*.md and data/README.md names a file of the repository, and its
// #anchor a heading of the Markdown file it names.
func TestRelativeLinks(t *testing.T) {
	root := repotest.Root(t)
	files := append(docFiles(t, root), filepath.Join("data", "README.md"))
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(data), "\n") {
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				file := filepath.Join(root, f)
				if path != "" {
					file = filepath.Join(root, filepath.Dir(f), path)
				}
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s:%d: link %q: %v", f, n+1, target, err)
					continue
				}
				if anchor == "" || !strings.HasSuffix(file, ".md") {
					continue
				}
				md, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				if !anchors(md)[anchor] {
					t.Errorf("%s:%d: link %q: no heading with anchor #%s", f, n+1, target, anchor)
				}
			}
		}
	}
}

// TestRewrite checks how a README command becomes the one the test runs:
// go run and a go.mod tool's go tool name the built binaries, a tool that
// is not go.mod's runs as written, and a README port is the same free
// port throughout a recipe and kept from the recipes running beside it.
func TestRewrite(t *testing.T) {
	root := repotest.Root(t)
	paths, err := modTools(root)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(paths, "helm.sh/helm/v3/cmd/helm") {
		t.Fatalf("go.mod tools %q: no helm, which docs/kubernetes.md runs", paths)
	}
	e := &env{root: root, bin: "/b", ports: map[string]bool{}, tools: map[string]*toolBuild{"helm": {}}}
	s := &session{t: t, e: e, dir: "/d", ports: map[string]string{}}
	got := s.rewrite("go tool helm lint x; (go tool pprof p) && go run ./cmd/coordinator --http-addr 127.0.0.1:8080 > /tmp/o")
	want := regexp.MustCompile(`^/b/helm lint x; \(go tool pprof p\) && /b/coordinator --http-addr 127\.0\.0\.1:([0-9]+) > /d/tmp/o$`)
	m := want.FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("rewrite: %q", got)
	}
	if again := s.rewrite("curl localhost:8080"); again != "curl localhost:"+m[1] {
		t.Errorf("the same README port in one recipe: %q, want port %s", again, m[1])
	}
	if !e.ports[m[1]] {
		t.Errorf("port %s not kept from the other recipes: %v", m[1], e.ports)
	}
}
