package workspace

import (
	"fmt"
	"path"
	"strings"
)

// DefaultExcludes are the paths PackHome callers normally leave out of a
// run's session state: caches that are rebuilt on demand, unix sockets, and
// the per-run model gateway's directory (which only means something while the
// run is alive).
var DefaultExcludes = []string{
	".cache",
	"node_modules/.cache",
	"*.sock",
	".gateway",
}

// excluder matches slash paths relative to the packed root against exclude
// patterns, gitignore style:
//   - a pattern is a path.Match glob over whole path components;
//   - a pattern with k components matches the last k components of a path at
//     any depth ("node_modules/.cache" matches "app/node_modules/.cache");
//   - a leading "/" anchors the pattern to the root ("/.cache" matches only
//     the top-level .cache);
//   - excluding a directory excludes everything below it.
type excluder struct {
	patterns []pattern
}

type pattern struct {
	glob     string
	parts    int // number of path components in glob
	anchored bool
}

func newExcluder(globs []string) (*excluder, error) {
	e := &excluder{}
	for _, g := range globs {
		anchored := strings.HasPrefix(g, "/")
		glob := strings.Trim(g, "/")
		if glob == "" {
			return nil, fmt.Errorf("exclude pattern %q matches nothing; give a path relative to home such as \".cache\"", g)
		}
		if _, err := path.Match(glob, ""); err != nil {
			return nil, fmt.Errorf("exclude pattern %q: %w; see path.Match for the syntax", g, err)
		}
		e.patterns = append(e.patterns, pattern{glob: glob, parts: strings.Count(glob, "/") + 1, anchored: anchored})
	}
	return e, nil
}

// match reports whether rel (a walked entry, whose ancestors did not match)
// is excluded.
func (e *excluder) match(rel string) bool {
	for _, p := range e.patterns {
		subject := rel
		if !p.anchored {
			subject = lastComponents(rel, p.parts)
		}
		if ok, _ := path.Match(p.glob, subject); ok {
			return true
		}
	}
	return false
}

// lastComponents returns the last n slash-separated components of rel.
func lastComponents(rel string, n int) string {
	i := len(rel)
	for ; n > 0 && i > 0; n-- {
		i = strings.LastIndexByte(rel[:i], '/')
	}
	return rel[i+1:]
}

// Matcher returns a function reporting whether a slash path relative to a
// scanned root is excluded by globs (the patterns of DefaultExcludes'
// syntax: whole path components, a leading "/" anchors to the root, a
// directory excludes what is below it). It fits ScanOptions.Exclude, which
// never asks about what lies below an excluded directory.
func Matcher(globs []string) (func(rel string) bool, error) {
	e, err := newExcluder(globs)
	if err != nil {
		return nil, err
	}
	return e.match, nil
}
