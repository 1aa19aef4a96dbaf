package idemkit_test

import (
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// markdownFiles are the repository's Markdown documents a reader follows
// links in: the front page, the changelog, the contribution and security
// notes and the guides (recorded benchmark outputs excluded).
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CHANGELOG.md", "CONTRIBUTING.md", "SECURITY.md"}
	err := filepath.WalkDir("docs", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path == filepath.Join("docs", "bench"):
			return filepath.SkipDir
		case !d.IsDir() && strings.HasSuffix(path, ".md"):
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	mdFence   = regexp.MustCompile("(?ms)^```.*?^```")
	mdCode    = regexp.MustCompile("`[^`\n]*`")
)

// anchors returns the anchors GitHub gives the headings of a Markdown text:
// lower case, punctuation dropped, spaces as dashes, -1, -2… for repeats.
func anchors(text string) []string {
	text = mdFence.ReplaceAllString(text, "")
	var out []string
	seen := map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(text, -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, a+"-"+itoa(n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}

// TestMarkdownLinks: every relative link of the documents names a file or
// directory of the repository, and every anchor (#…) a heading of the
// document it points into.
func TestMarkdownLinks(t *testing.T) {
	for _, file := range markdownFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := mdCode.ReplaceAllString(mdFence.ReplaceAllString(string(b), ""), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			u, err := url.Parse(target)
			if err != nil {
				t.Errorf("%s: link %q does not parse: %v", file, target, err)
				continue
			}
			if u.Scheme != "" || u.Host != "" {
				continue // an outside address: not checked here
			}
			dest := file
			if u.Path != "" {
				dest = filepath.Join(filepath.Dir(file), u.Path)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %q: %s does not exist", file, target, dest)
					continue
				}
			}
			if u.Fragment == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			db, err := os.ReadFile(dest)
			if err != nil {
				t.Errorf("%s: link %q: %v", file, target, err)
				continue
			}
			if !slices.Contains(anchors(string(db)), u.Fragment) {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", file, target, dest, u.Fragment)
			}
		}
	}
}

func TestAnchors(t *testing.T) {
	got := anchors("# Observability: metrics, alerts\n## A `code` title\n## Twice\n## Twice\n```\n# not a heading\n```\n")
	want := []string{"observability-metrics-alerts", "a-code-title", "twice", "twice-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("anchors = %v, want %v", got, want)
	}
}

// TestRunbookAnchors: every alert rule's runbook annotation names a
// heading of docs/observability.md.
func TestRunbookAnchors(t *testing.T) {
	rules, err := os.ReadFile("deploy/prometheus/idemkit-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	have := anchors(string(doc))
	runbooks := regexp.MustCompile(`runbook: docs/observability\.md#(\S+)`).FindAllStringSubmatch(string(rules), -1)
	alerts := regexp.MustCompile(`(?m)^\s+- alert: `).FindAllString(string(rules), -1)
	if len(runbooks) == 0 || len(runbooks) != len(alerts) {
		t.Fatalf("%d runbook annotations for %d alerts, want one each", len(runbooks), len(alerts))
	}
	for _, m := range runbooks {
		if !slices.Contains(have, m[1]) {
			t.Errorf("runbook #%s: docs/observability.md has no such heading", m[1])
		}
	}
}

// TestGettingStartedQuotesTheExample: every Go block of the getting-started
// guide, and the README's quick start, is an excerpt of
// examples/service/main.go, which the suite builds and runs: their code
// compiles and works because the file does.
func TestGettingStartedQuotesTheExample(t *testing.T) {
	guide, err := os.ReadFile("docs/getting-started.md")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	quick := regexp.MustCompile("(?s)## Quick start\n\n[^#]*?(```go\n.*?```)").FindSubmatch(readme)
	if quick == nil {
		t.Fatal("the README has no Go block under ## Quick start")
	}
	guide = append(append(guide, '\n'), quick[1]...)
	example, err := os.ReadFile("examples/service/main.go")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(guide), -1)
	if len(blocks) < 5 {
		t.Fatalf("the guide has %d Go blocks, want its steps'", len(blocks))
	}
	for _, b := range blocks {
		if !strings.Contains(string(example), b[1]) {
			t.Errorf("a Go block of the guide is not in examples/service/main.go:\n%s", b[1])
		}
	}
}

// TestGoBlocksAreExcerpts: every Go block of the README and the guides is,
// line for line (indentation aside), an excerpt of a Go file of the
// repository — an example or a program the suite builds — so that no
// block shows code that does not compile.
func TestGoBlocksAreExcerpts(t *testing.T) {
	dedent := func(s string) string {
		lines := strings.Split(s, "\n")
		for i, l := range lines {
			lines[i] = strings.TrimLeft(l, " \t")
		}
		return strings.Join(lines, "\n")
	}
	var sources []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (d.Name() == ".dev" || d.Name() == ".git"):
			return filepath.SkipDir
		case !d.IsDir() && strings.HasSuffix(path, ".go"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sources = append(sources, dedent(string(b)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range markdownFiles(t) {
		if file == "CHANGELOG.md" {
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
			block := dedent(m[1])
			if !slices.ContainsFunc(sources, func(src string) bool { return strings.Contains(src, block) }) {
				t.Errorf("%s: a Go block is in no Go file of the repository (make it an Example):\n%s", file, m[1])
			}
		}
	}
}
