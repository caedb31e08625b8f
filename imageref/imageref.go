// Package imageref normalizes image references and checks them against an
// allow list of image patterns, for hosts that let tenants choose their run
// image but only among images the operator trusts.
//
// References are normalized as docker does (github.com/distribution/reference):
// "ubuntu" is docker.io/library/ubuntu:latest, "me/agent" is
// docker.io/me/agent:latest, a name without a registry is on docker.io, and a
// reference without tag or digest has the tag latest.
//
// A pattern is a reference whose parts may hold globs:
//
//	NAME              every tag and every digest of NAME
//	NAME:TAG          a tag of NAME matching TAG (":*" any tag, ":v1.*")
//	NAME@sha256:HEX   exactly that digest of NAME
//	NAME@sha256:*     any digest of NAME (the image must be pinned)
//
// NAME is normalized like a reference and may hold the globs of path.Match
// ("*", "?", "[a-z]"), which never cross a "/": registry.example.com/team/*
// matches registry.example.com/team/agent but not
// registry.example.com/team/sub/agent. A tag pattern matches only a
// reference by tag and a digest pattern only a reference by digest: a run
// asking for a tag is refused by NAME@sha256:HEX even when that tag points
// to the allowed digest today, since it may point elsewhere at pull time.
// An image ID (sha256:...) matches no pattern.
package imageref

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/distribution/reference"
)

// ErrNotAllowed is wrapped by Allowlist.Check for an image no pattern allows.
var ErrNotAllowed = errors.New("image not allowed")

// ErrBadPattern is wrapped by ParseAllowlist for a pattern that cannot be
// parsed.
var ErrBadPattern = errors.New("bad image pattern")

// Normalize returns ref in its fully qualified form,
// registry/path:tag or registry/path[:tag]@digest (docker.io/library/ubuntu:latest
// for "ubuntu").
func Normalize(ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", ref, err)
	}
	return reference.TagNameOnly(named).String(), nil
}

// pattern is one parsed allow-list entry.
type pattern struct {
	raw string
	// name is the normalized repository glob, e.g. docker.io/library/ubuntu.
	name string
	// kind says what the pattern allows besides the name.
	kind patternKind
	// tag is the tag glob (kindTag); digest the digest or its glob (kindDigest).
	tag, digest string
}

type patternKind int

const (
	kindAny patternKind = iota
	kindTag
	kindDigest
)

// Allowlist is a parsed list of image patterns. The zero Allowlist allows
// every image.
type Allowlist struct {
	patterns []pattern
}

// ParseAllowlist parses patterns (see the package documentation). An empty
// list allows every image.
func ParseAllowlist(patterns []string) (Allowlist, error) {
	var a Allowlist
	var errs []error
	for _, raw := range patterns {
		p, err := parsePattern(raw)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		a.patterns = append(a.patterns, p)
	}
	if len(errs) > 0 {
		return Allowlist{}, errors.Join(errs...)
	}
	return a, nil
}

// Empty reports whether the list allows every image.
func (a Allowlist) Empty() bool { return len(a.patterns) == 0 }

// parsePattern splits raw into its name, tag and digest globs and normalizes
// the name as a reference would be.
func parsePattern(raw string) (pattern, error) {
	bad := func(why string) (pattern, error) {
		return pattern{}, fmt.Errorf("%w %q: %s; use NAME, NAME:TAG or NAME@sha256:HEX, where NAME and TAG may hold * globs", ErrBadPattern, raw, why)
	}
	s := strings.TrimSpace(raw)
	if s == "" {
		return bad("empty")
	}
	p := pattern{raw: raw}
	if name, dig, ok := strings.Cut(s, "@"); ok {
		algo, hex, ok := strings.Cut(dig, ":")
		if !ok || algo != "sha256" || hex == "" {
			return bad("a digest is sha256:HEX or sha256:*")
		}
		if hex != "*" && !isHex64(hex) {
			return bad("a sha256 digest has 64 lowercase hex digits")
		}
		s, p.kind, p.digest = name, kindDigest, dig
	}
	// A tag follows the last ":" after the last "/" (a registry's port is
	// before it).
	slash := strings.LastIndex(s, "/")
	if i := strings.LastIndex(s, ":"); i > slash {
		if p.kind == kindDigest {
			return bad("give a tag or a digest, not both")
		}
		s, p.kind, p.tag = s[:i], kindTag, s[i+1:]
		if p.tag == "" {
			return bad("empty tag")
		}
		if _, err := path.Match(p.tag, ""); err != nil {
			return bad("tag glob: " + err.Error())
		}
	}
	name, err := normalizeNameGlob(s)
	if err != nil {
		return bad(err.Error())
	}
	p.name = name
	return p, nil
}

// normalizeNameGlob normalizes a repository name that may hold globs, as
// reference.ParseNormalizedNamed does for a plain name: each glob is replaced
// by a placeholder that parses as a name, and put back afterwards.
func normalizeNameGlob(s string) (string, error) {
	if _, err := path.Match(s, ""); err != nil {
		return "", fmt.Errorf("name glob: %w", err)
	}
	var globs []string
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && strings.IndexByte("*?[", s[j]) < 0 {
			j++
		}
		b.WriteString(s[i:j])
		if j == len(s) {
			break
		}
		// The glob runs to the end of its class or is one character.
		end := j + 1
		if s[j] == '[' {
			end = strings.IndexByte(s[j:], ']') + j + 1
		}
		globs = append(globs, s[j:end])
		fmt.Fprintf(&b, "x%dglobx", len(globs)-1)
		i = end
	}
	named, err := reference.ParseNormalizedNamed(b.String())
	if err != nil {
		return "", err
	}
	if !reference.IsNameOnly(named) {
		return "", errors.New("the name holds a tag or digest")
	}
	out := named.Name()
	for i, g := range globs {
		out = strings.Replace(out, fmt.Sprintf("x%dglobx", i), g, 1)
	}
	return out, nil
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Check returns nil when the list is empty or a pattern allows ref, else an
// error wrapping ErrNotAllowed that names ref's normalized form and the
// patterns. flag names where the list came from in the message (e.g.
// "--allowed-images").
func (a Allowlist) Check(ref, flag string) error {
	if a.Empty() {
		return nil
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return fmt.Errorf("%w: %q is not an image name (an image ID matches no %s pattern): %w", ErrNotAllowed, ref, flag, err)
	}
	named = reference.TagNameOnly(named)
	for _, p := range a.patterns {
		if p.matches(named) {
			return nil
		}
	}
	raws := make([]string, len(a.patterns))
	for i, p := range a.patterns {
		raws[i] = p.raw
	}
	return fmt.Errorf("%w: %s (%s) matches none of %s %s; choose an allowed image or ask the host's operator to add it",
		ErrNotAllowed, ref, named.String(), flag, strings.Join(raws, ", "))
}

// matches reports whether p allows the normalized reference named.
func (p pattern) matches(named reference.Named) bool {
	if ok, _ := path.Match(p.name, named.Name()); !ok {
		return false
	}
	tagged, hasTag := named.(reference.Tagged)
	digested, hasDigest := named.(reference.Digested)
	switch p.kind {
	case kindTag:
		if hasDigest || !hasTag {
			return false
		}
		ok, _ := path.Match(p.tag, tagged.Tag())
		return ok
	case kindDigest:
		if !hasDigest {
			return false
		}
		d := digested.Digest().String()
		if p.digest == "sha256:*" {
			return strings.HasPrefix(d, "sha256:")
		}
		return d == p.digest
	}
	return true
}
