package changeset

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/taskrun/taskrun/workspace"
)

// Kind is what happened to one path.
type Kind string

// Change kinds.
const (
	Added       Kind = "added"
	Deleted     Kind = "deleted"
	Modified    Kind = "modified"
	Renamed     Kind = "renamed"
	ModeChanged Kind = "mode_changed"
	TypeChanged Kind = "type_changed"
)

// Change is one changed path of a change set.
type Change struct {
	// Path is the path in the final tree (the deleted path for Deleted).
	Path string `json:"path"`
	// OldPath is the path a Renamed file had at the start.
	OldPath string `json:"old_path,omitempty"`
	Kind    Kind   `json:"kind"`
	// OldMode and NewMode are git modes ("100644", "100755", "120000"),
	// empty for the side where the path does not exist.
	OldMode   string `json:"old_mode,omitempty"`
	NewMode   string `json:"new_mode,omitempty"`
	OldSize   int64  `json:"old_size"`
	NewSize   int64  `json:"new_size"`
	OldSHA256 string `json:"old_sha256,omitempty"`
	NewSHA256 string `json:"new_sha256,omitempty"`
	// Binary marks content carried as a GIT binary patch.
	Binary bool `json:"binary,omitempty"`
	// Insertions and Deletions count a text change's lines.
	Insertions int `json:"insertions,omitempty"`
	Deletions  int `json:"deletions,omitempty"`
	// Omitted says why the change is not in the patch (over a cap, or its
	// starting content was not kept); empty when it is.
	Omitted string `json:"omitted,omitempty"`
	// NotHashed says why a side has no digest (a sparse file, or over a
	// hashing bound): the path is listed as changed without comparing
	// its content, and left out of the patch.
	NotHashed string `json:"not_hashed,omitempty"`
}

// Summary counts a change set, small enough for a status report.
type Summary struct {
	Files       int `json:"files"`
	Added       int `json:"added"`
	Deleted     int `json:"deleted"`
	Modified    int `json:"modified"`
	Renamed     int `json:"renamed"`
	ModeChanged int `json:"mode_changed"`
	TypeChanged int `json:"type_changed"`
	Omitted     int `json:"omitted"`
	// NotHashed counts the changes listed without a digest.
	NotHashed  int   `json:"not_hashed,omitempty"`
	Insertions int   `json:"insertions"`
	Deletions  int   `json:"deletions"`
	PatchBytes int64 `json:"patch_bytes"`
}

// Set is a run's change set: what changes.json holds.
type Set struct {
	// BaseCommit is the git workspace's HEAD at the start ("" otherwise).
	BaseCommit string `json:"base_commit,omitempty"`
	// Git says the workspace was a git work tree, so .gitignore applied.
	Git bool `json:"git"`
	// TreeHash identifies the final tree (see TreeHash).
	TreeHash string `json:"tree_hash"`
	// PatchSHA256 is the digest of the patch written.
	PatchSHA256 string   `json:"patch_sha256"`
	Summary     Summary  `json:"summary"`
	Changes     []Change `json:"changes"`
	// Ignored counts paths that ignore rules left out.
	Ignored int `json:"ignored,omitempty"`
	// Excluded are the patterns (Options.Exclude) whose paths were left
	// out of both trees, so neither the patch nor the tree hash has them.
	Excluded []string `json:"excluded,omitempty"`
	// Skipped lists entries of either tree that could not be compared
	// (special files, over a cap), the first workspace.MaxSkips of them.
	Skipped []workspace.Skip `json:"skipped,omitempty"`
	// Notes say what makes the change set incomplete.
	Notes []string `json:"notes,omitempty"`
}

// Compute compares home, after the run, with the starting tree Snapshot
// recorded in baseDir, writes the patch to patch and returns the change set.
//
// The patch is in git's format and `git apply` applies it to the starting
// tree: text hunks, new, deleted and renamed (identical content) files, mode
// changes, symlinks and binary files (as GIT binary patch literals). A
// change over a cap is listed in Set.Changes with the reason in Omitted and
// left out of the patch. The home is hostile: it is scanned once, without
// following a symlink, and the content the patch needs is copied into
// baseDir before any of it is interpreted.
func Compute(ctx context.Context, baseDir, home string, patch io.Writer) (*Set, error) {
	m, err := loadManifest(baseDir)
	if err != nil {
		return nil, err
	}
	lim := m.Limits.withDefaults()
	c := &computer{m: m, lim: lim, baseDir: baseDir, old: make(map[string]entry, len(m.Entries))}
	for _, e := range m.Entries {
		c.old[e.Path] = e
	}
	err = c.scanHome(ctx, home)
	if c.newPack != nil {
		defer c.newPack.Close()
	}
	if err != nil {
		return nil, err
	}
	set := &Set{BaseCommit: m.BaseCommit, Git: m.Git, Notes: slices.Clone(m.Notes), Excluded: slices.Clone(m.Exclude)}
	if m.Git {
		n, err := c.dropIgnored(ctx)
		if err != nil {
			return nil, err
		}
		set.Ignored = n
	}
	set.Skipped = append(slices.Clone(m.Scan.Skipped), c.scan.Skipped...)
	if len(set.Skipped) > workspace.MaxSkips {
		set.Skipped = set.Skipped[:workspace.MaxSkips]
	}
	if m.Scan.OverCap+c.scan.OverCap > 0 {
		set.Notes = append(set.Notes, fmt.Sprintf("%d entries over the %d-entry cap were not compared", m.Scan.OverCap+c.scan.OverCap, lim.MaxEntries))
	}
	if n := c.notHashed(); n > 0 {
		set.Notes = append(set.Notes, fmt.Sprintf("%d files were not hashed (sparse, or over the %d-byte or %s hashing bound): they are listed as changed, and the tree hash does not cover their content", n, lim.MaxHashBytes, lim.HashTimeout))
	}
	set.TreeHash = TreeHash(c.finalEntries())
	set.Changes = c.changes()
	h := sha256.New()
	cw := &countWriter{w: bufio.NewWriterSize(io.MultiWriter(patch, h), 64<<10)}
	for i := range set.Changes {
		if err := c.writePatch(cw, &set.Changes[i]); err != nil {
			return nil, fmt.Errorf("changeset: write patch: %w", err)
		}
	}
	if err := cw.w.(*bufio.Writer).Flush(); err != nil {
		return nil, fmt.Errorf("changeset: write patch: %w", err)
	}
	set.PatchSHA256 = hex.EncodeToString(h.Sum(nil))
	set.Summary = summarize(set.Changes, cw.n)
	return set, nil
}

type computer struct {
	m       *manifest
	lim     Limits
	baseDir string
	old     map[string]entry
	cur     map[string]entry
	// newPack holds the final content of changed files (entries of cur
	// with Kept set, at their Offset).
	newPack *os.File
	tooBig  map[string]string
	scan    workspace.ScanReport
	copied  int64
}

// scanHome hashes every file of home and copies the content of changed
// files, within the caps, into the baseline's new-content pack.
func (c *computer) scanHome(ctx context.Context, home string) error {
	pack, err := os.OpenFile(filepath.Join(c.baseDir, newPack), os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	c.newPack = pack
	pw := bufio.NewWriterSize(pack, 256<<10)
	c.cur = make(map[string]entry)
	c.tooBig = make(map[string]string)
	exclude, err := scanExclude(c.m.Exclude)
	if err != nil {
		return err
	}
	buf := new(bytes.Buffer)
	budget, cancel := newHashBudget(ctx, c.lim)
	defer cancel()
	c.scan, err = workspace.Scan(ctx, home, workspace.ScanOptions{Exclude: exclude, MaxEntries: c.lim.MaxEntries},
		func(ctx context.Context, e workspace.ScanEntry) error {
			en := entry{Path: e.RelPath, Mode: gitMode(e.Mode), Size: e.Size}
			if e.Reader == nil {
				en.Target = e.Target
				en.SHA256 = sha256Hex([]byte(e.Target))
				c.cur[en.Path] = en
				return nil
			}
			if e.Size > c.lim.MaxFileBytes {
				_, digest, notHashed, err := budget.hash(ctx, e, io.Discard)
				if err != nil {
					return err
				}
				en.SHA256, en.NotHashed = digest, notHashed
				c.tooBig[en.Path] = fmt.Sprintf("file of %d bytes is over the %d-byte per-file cap (MaxFileBytes)", e.Size, c.lim.MaxFileBytes)
				c.cur[en.Path] = en
				return nil
			}
			buf.Reset()
			_, digest, notHashed, err := budget.hash(ctx, e, buf)
			if err != nil {
				return err
			}
			en.SHA256, en.NotHashed = digest, notHashed
			if notHashed != "" {
				c.cur[en.Path] = en
				return nil // compared as changed; no content in the patch
			}
			if old, ok := c.old[en.Path]; ok && old.SHA256 == en.SHA256 && old.Target == "" {
				c.cur[en.Path] = en
				return nil // unchanged content
			}
			if int64(buf.Len()) > c.lim.MaxPatchBytes-c.copied {
				c.tooBig[en.Path] = fmt.Sprintf("the patch's %d-byte content cap (MaxPatchBytes) was reached", c.lim.MaxPatchBytes)
				c.cur[en.Path] = en
				return nil
			}
			if _, err := pw.Write(buf.Bytes()); err != nil {
				return err
			}
			en.Kept, en.Offset, en.Size = true, c.copied, int64(buf.Len())
			c.copied += en.Size
			c.cur[en.Path] = en
			return nil
		})
	if err != nil {
		return fmt.Errorf("changeset: scan home: %w", err)
	}
	if err := pw.Flush(); err != nil {
		return fmt.Errorf("changeset: scan home: %w", err)
	}
	return nil
}

// dropIgnored removes the paths the starting ignore rules ignore from both
// trees, except those the base commit tracks, and returns how many it
// removed.
func (c *computer) dropIgnored(ctx context.Context) (int, error) {
	tracked := make(map[string]bool, len(c.m.Tracked))
	for _, p := range c.m.Tracked {
		tracked[p] = true
	}
	var candidates []string
	for p := range c.old {
		if !tracked[p] {
			candidates = append(candidates, p)
		}
	}
	for p := range c.cur {
		if _, ok := c.old[p]; !ok && !tracked[p] {
			candidates = append(candidates, p)
		}
	}
	sort.Strings(candidates)
	ignored, err := ignoredPaths(ctx, filepath.Join(c.baseDir, ignoreRepo), candidates)
	if err != nil {
		return 0, fmt.Errorf("changeset: evaluate .gitignore rules: %w", err)
	}
	n := 0
	for p := range ignored {
		_, inOld := c.old[p]
		_, inCur := c.cur[p]
		if inOld || inCur {
			n++
		}
		delete(c.old, p)
		delete(c.cur, p)
	}
	return n, nil
}

// notHashed counts the files of either tree recorded without a digest.
func (c *computer) notHashed() int {
	n := 0
	for _, e := range c.old {
		if e.NotHashed != "" {
			n++
		}
	}
	for _, e := range c.cur {
		if e.NotHashed != "" {
			n++
		}
	}
	return n
}

// finalEntries returns the final tree's entries in path order.
func (c *computer) finalEntries() []TreeEntry {
	out := make([]TreeEntry, 0, len(c.cur))
	for _, e := range c.cur {
		out = append(out, TreeEntry{Path: e.Path, Mode: e.Mode, SHA256: e.SHA256})
	}
	return out
}

// changes pairs the two trees into changes, in path order, detecting
// renames of identical content.
func (c *computer) changes() []Change {
	var added, deleted []entry
	var out []Change
	for p, o := range c.old {
		n, ok := c.cur[p]
		switch {
		case !ok:
			deleted = append(deleted, o)
		case (o.Mode == modeSymlink) != (n.Mode == modeSymlink):
			out = append(out, c.pair(TypeChanged, o, n))
		case o.NotHashed != "" || n.NotHashed != "":
			out = append(out, c.pair(Modified, o, n)) // cannot be compared
		case o.SHA256 != n.SHA256:
			out = append(out, c.pair(Modified, o, n))
		case o.Mode != n.Mode:
			out = append(out, c.pair(ModeChanged, o, n))
		}
	}
	for p, n := range c.cur {
		if _, ok := c.old[p]; !ok {
			added = append(added, n)
		}
	}
	sort.Slice(deleted, func(i, j int) bool { return deleted[i].Path < deleted[j].Path })
	sort.Slice(added, func(i, j int) bool { return added[i].Path < added[j].Path })
	// A deleted and an added file of the same type and (non-empty) content
	// are a rename.
	byContent := make(map[string][]int)
	for i, d := range deleted {
		if d.Size == 0 || d.NotHashed != "" {
			continue // as in git, empty files are never paired; nor are unhashed ones
		}
		k := renameKey(d)
		byContent[k] = append(byContent[k], i)
	}
	renamed := make(map[int]bool)
	for _, a := range added {
		k := renameKey(a)
		if idx := byContent[k]; len(idx) > 0 && a.NotHashed == "" {
			byContent[k] = idx[1:]
			renamed[idx[0]] = true
			ch := c.pair(Renamed, deleted[idx[0]], a)
			ch.OldPath = deleted[idx[0]].Path
			out = append(out, ch)
			continue
		}
		out = append(out, c.pair(Added, entry{}, a))
	}
	for i, d := range deleted {
		if !renamed[i] {
			out = append(out, c.pair(Deleted, d, entry{}))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func renameKey(e entry) string {
	kind := "f"
	if e.Mode == modeSymlink {
		kind = "l"
	}
	return kind + e.SHA256
}

// pair builds the Change between o (start) and n (final); a zero entry is
// a side where the path does not exist.
func (c *computer) pair(kind Kind, o, n entry) Change {
	ch := Change{Kind: kind, Path: n.Path}
	if n.Path == "" {
		ch.Path = o.Path
	}
	if o.Path != "" {
		ch.OldMode, ch.OldSize, ch.OldSHA256 = modeString(o.Mode), o.Size, o.SHA256
	}
	if n.Path != "" {
		ch.NewMode, ch.NewSize, ch.NewSHA256 = modeString(n.Mode), n.Size, n.SHA256
	}
	ch.NotHashed = n.NotHashed
	if ch.NotHashed == "" {
		ch.NotHashed = o.NotHashed
	}
	return ch
}

func summarize(changes []Change, patchBytes int64) Summary {
	s := Summary{Files: len(changes), PatchBytes: patchBytes}
	for _, ch := range changes {
		switch ch.Kind {
		case Added:
			s.Added++
		case Deleted:
			s.Deleted++
		case Modified:
			s.Modified++
		case Renamed:
			s.Renamed++
		case ModeChanged:
			s.ModeChanged++
		case TypeChanged:
			s.TypeChanged++
		}
		if ch.Omitted != "" {
			s.Omitted++
		}
		if ch.NotHashed != "" {
			s.NotHashed++
		}
		s.Insertions += ch.Insertions
		s.Deletions += ch.Deletions
	}
	return s
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
