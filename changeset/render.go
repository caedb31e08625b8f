package changeset

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// TreeEntry is one file or symlink of a tree, as TreeHash hashes it.
type TreeEntry struct {
	Path   string
	Mode   uint32
	SHA256 string
}

// TreeHash identifies a tree by its files and symlinks: "sha256:" and the
// hex SHA-256 of one record per entry in byte order of path, each the git
// mode in octal, a space, the content's hex SHA-256 (a symlink's target), a
// space, the path and a NUL byte. Two trees with the same paths, git modes
// and content have the same hash.
func TreeHash(entries []TreeEntry) string {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b TreeEntry) int { return strings.Compare(a.Path, b.Path) })
	h := sha256.New()
	for _, e := range sorted {
		fmt.Fprintf(h, "%06o %s %s\x00", e.Mode, e.SHA256, e.Path)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// side is one side of a file diff; exists is false for /dev/null.
type side struct {
	exists  bool
	mode    string
	content []byte
}

// writePatch writes ch's part of the patch, or records in ch.Omitted why
// it cannot.
func (c *computer) writePatch(w io.Writer, ch *Change) error {
	a, b := prefixed("a/", ch.Path), prefixed("b/", ch.Path)
	switch ch.Kind {
	case Renamed:
		a = prefixed("a/", ch.OldPath)
		if _, err := fmt.Fprintf(w, "diff --git %s %s\n", a, b); err != nil {
			return err
		}
		if ch.OldMode != ch.NewMode {
			if _, err := fmt.Fprintf(w, "old mode %s\nnew mode %s\n", ch.OldMode, ch.NewMode); err != nil {
				return err
			}
		}
		_, err := fmt.Fprintf(w, "similarity index 100%%\nrename from %s\nrename to %s\n", quotePath(ch.OldPath), quotePath(ch.Path))
		return err
	case ModeChanged:
		_, err := fmt.Fprintf(w, "diff --git %s %s\nold mode %s\nnew mode %s\n", a, b, ch.OldMode, ch.NewMode)
		return err
	}
	if ch.NotHashed != "" {
		ch.Omitted = ch.NotHashed
		return nil
	}
	oldSide, newSide, reason := c.sides(ch)
	if reason != "" {
		ch.Omitted = reason
		return nil
	}
	if ch.Kind == TypeChanged {
		if err := writeFileDiff(w, ch, oldSide, side{}); err != nil {
			return err
		}
		return writeFileDiff(w, ch, side{}, newSide)
	}
	return writeFileDiff(w, ch, oldSide, newSide)
}

// sides loads the start and final content ch needs, or says why it cannot.
func (c *computer) sides(ch *Change) (oldSide, newSide side, reason string) {
	if ch.OldMode != "" {
		o := c.old[ch.Path]
		oldSide = side{exists: true, mode: ch.OldMode}
		switch {
		case o.Mode == modeSymlink:
			oldSide.content = []byte(o.Target)
		case !o.Kept:
			return side{}, side{}, "starting content was not kept (over MaxBaseBytes)"
		default:
			b, err := readSection(filepath.Join(c.baseDir, basePack), o.Offset, o.Size)
			if err != nil {
				return side{}, side{}, "starting content unreadable: " + err.Error()
			}
			oldSide.content = b
		}
	}
	if ch.NewMode != "" {
		n := c.cur[ch.Path]
		newSide = side{exists: true, mode: ch.NewMode}
		switch {
		case n.Mode == modeSymlink:
			newSide.content = []byte(n.Target)
		case c.tooBig[ch.Path] != "":
			return side{}, side{}, c.tooBig[ch.Path]
		case !n.Kept:
			return side{}, side{}, "final content was not kept"
		default:
			b := make([]byte, n.Size)
			if _, err := c.newPack.ReadAt(b, n.Offset); err != nil {
				return side{}, side{}, "final content unreadable: " + err.Error()
			}
			newSide.content = b
		}
	}
	return oldSide, newSide, ""
}

// writeFileDiff writes one "diff --git" section from o to n, as text hunks
// or, when either side is binary, as a GIT binary patch literal.
func writeFileDiff(w io.Writer, ch *Change, o, n side) error {
	a, b := prefixed("a/", ch.Path), prefixed("b/", ch.Path)
	var hdr strings.Builder
	fmt.Fprintf(&hdr, "diff --git %s %s\n", a, b)
	oldID, newID := zeroBlob, zeroBlob
	switch {
	case !o.exists:
		fmt.Fprintf(&hdr, "new file mode %s\n", n.mode)
	case !n.exists:
		fmt.Fprintf(&hdr, "deleted file mode %s\n", o.mode)
	case o.mode != n.mode:
		fmt.Fprintf(&hdr, "old mode %s\nnew mode %s\n", o.mode, n.mode)
	}
	if o.exists {
		oldID = gitBlobID(o.content)
	}
	if n.exists {
		newID = gitBlobID(n.content)
	}
	fmt.Fprintf(&hdr, "index %s..%s", oldID, newID)
	if o.exists && n.exists && o.mode == n.mode {
		fmt.Fprintf(&hdr, " %s", o.mode)
	}
	hdr.WriteString("\n")
	if _, err := io.WriteString(w, hdr.String()); err != nil {
		return err
	}
	if isBinary(o.content) || isBinary(n.content) {
		ch.Binary = true
		return writeBinaryLiteral(w, n.content)
	}
	if len(o.content) == 0 && len(n.content) == 0 {
		return nil // an empty file created or deleted: the header says it all
	}
	from, to := a, b
	if !o.exists {
		from = "/dev/null"
	}
	if !n.exists {
		to = "/dev/null"
	}
	if _, err := fmt.Fprintf(w, "--- %s\n+++ %s\n", from, to); err != nil {
		return err
	}
	ins, del, err := writeHunks(w, diffLines(splitLines(o.content), splitLines(n.content)))
	ch.Insertions += ins
	ch.Deletions += del
	return err
}

// readSection reads size bytes at off of the file at name.
func readSection(name string, off, size int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, size)
	if _, err := f.ReadAt(b, off); err != nil && !(errors.Is(err, io.EOF) && size == 0) {
		return nil, err
	}
	return b, nil
}
