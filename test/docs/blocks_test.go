//go:build linux

package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// A block is a fenced block of a markdown file that the test runs, marked
// by an HTML comment on the line before its fence:
//
//	<!-- docs-test: NAME -->            commands, run as the reader types them
//	<!-- docs-test: NAME file=FILE -->  a file the reader saves as FILE
//
// The steps of TestNewcomer take blocks by name.
type block struct {
	name   string
	where  string // file:line of the marker
	body   string // the lines between the fences, each ending in "\n"
	saveAs string // file=FILE
}

var markerRE = regexp.MustCompile(`^<!-- docs-test: ([a-z0-9-]+)(?: file=(\S+))? -->$`)

// readBlocks reads the marked blocks of every markdown file tracked in the
// clone. One name may mark a block in several files (a command the docs
// give in two places): the copies must be the same, so that none drifts.
func readBlocks(t *testing.T, clone string) map[string]*block {
	t.Helper()
	blocks := map[string]*block{}
	for _, file := range strings.Fields(git(t, clone, "ls-files", "*.md")) {
		text, err := os.ReadFile(filepath.Join(clone, file))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(text), "\n")
		for i, line := range lines {
			if !strings.HasPrefix(line, "<!-- docs-test") {
				continue
			}
			where := file + ":" + strconv.Itoa(i+1)
			m := markerRE.FindStringSubmatch(strings.TrimSpace(line))
			if m == nil {
				t.Errorf("%s: %q is no marker the test reads: <!-- docs-test: NAME --> or <!-- docs-test: NAME file=FILE -->", where, line)
				continue
			}
			if i+1 == len(lines) || !strings.HasPrefix(lines[i+1], "```") {
				t.Errorf("%s: the marker %s is not on the line before a fence", where, m[1])
				continue
			}
			end := i + 2
			for end < len(lines) && lines[end] != "```" {
				end++
			}
			if end == len(lines) {
				t.Errorf("%s: the block marked %s has no closing fence", where, m[1])
				continue
			}
			b := &block{name: m[1], where: where, saveAs: m[2], body: strings.Join(lines[i+2:end], "\n") + "\n"}
			if prev, ok := blocks[b.name]; ok {
				if prev.body != b.body || prev.saveAs != b.saveAs {
					t.Errorf("%s and %s are both marked %s but say different things: make the copies the same", prev.where, b.where, b.name)
				}
				continue
			}
			blocks[b.name] = b
		}
	}
	return blocks
}

// with is the block with each placeholder (such as "<token>") replaced by
// what the reader would put there.
func (b *block) with(oldnew ...string) *block {
	c := *b
	c.body = strings.NewReplacer(oldnew...).Replace(b.body)
	return &c
}

// line is the block as one line, for a frame to paste.
func (b *block) line() string { return strings.TrimSpace(b.body) }

// unused names the marked blocks no step took.
func unused(blocks map[string]*block, used map[string]bool) []string {
	var names []string
	for name, b := range blocks {
		if !used[name] {
			names = append(names, b.where+" ("+name+")")
		}
	}
	sort.Strings(names)
	return names
}
