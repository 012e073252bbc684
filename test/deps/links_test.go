package deps

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/village-cni/village/internal/testenv"
)

// TestDocLinks: every relative link of the README, DEVELOPERS.md and
// docs/*.md names a file or directory of the repository, and every
// #anchor of a link to a Markdown file (or within the same one) names one
// of its headings, spelled as GitHub spells heading anchors. Links to
// other sites are not followed.
func TestDocLinks(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := append([]string{filepath.Join(root, "README.md"), filepath.Join(root, "DEVELOPERS.md")}, docs...)
	anchors := map[string]map[string]bool{} // by absolute path
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a, nil
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		for _, l := range markdownLinks(string(b)) {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(l.target, "#")
			target := file
			if path != "" {
				target = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s:%d: link to %q: %v", rel, l.line, l.target, err)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			a, err := anchorsOf(target)
			if err != nil {
				t.Errorf("%s:%d: link to %q: %v", rel, l.line, l.target, err)
				continue
			}
			if !a[anchor] {
				t.Errorf("%s:%d: link to %q: no heading of %s has the anchor #%s", rel, l.line, l.target, filepath.Base(target), anchor)
			}
		}
	}
}

// TestHeadingAnchors: the anchors are GitHub's: lower case, punctuation
// but '-' and '_' dropped, spaces made '-', a repeated heading numbered;
// headings in code blocks are not headings.
func TestHeadingAnchors(t *testing.T) {
	got := headingAnchors("# Troubleshooting with `villaged status`\n## Bridged traffic and `br_netfilter`\n" +
		"### Pod start under a real kubelet (-only kubelet)\n## ADD / DEL: 0.43×, p50–p99\n## Tests\n## Tests\n" +
		"```\n# villaged why np/far np/web\n```\n")
	for _, want := range []string{"troubleshooting-with-villaged-status", "bridged-traffic-and-br_netfilter",
		"pod-start-under-a-real-kubelet--only-kubelet", "add--del-043-p50p99", "tests", "tests-1"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if len(got) != 6 {
		t.Errorf("anchors %v: want 6 (none from the code block)", got)
	}
}

type link struct {
	target string
	line   int
}

var (
	linkRE     = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeSpanRE = regexp.MustCompile("`[^`]*`")
	headingRE  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// markdownLinks are the inline links of a Markdown text outside code
// blocks and code spans.
func markdownLinks(text string) []link {
	var out []link
	fenced := false
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range linkRE.FindAllStringSubmatch(codeSpanRE.ReplaceAllString(line, ""), -1) {
			out = append(out, link{target: m[1], line: i + 1})
		}
	}
	return out
}

// headingAnchors are the anchors GitHub gives a Markdown text's headings.
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		m := headingRE.FindStringSubmatch(line)
		if fenced || m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsNumber(r) || unicode.Is(unicode.Pc, r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}
