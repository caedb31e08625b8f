package changeset

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/taskrun/taskrun/workspace"
)

// Limits bound what a change set costs the host. Zero fields take the
// DefaultLimits value, never "unlimited".
type Limits struct {
	// MaxEntries caps the files and symlinks scanned in each tree.
	MaxEntries int64
	// MaxBaseBytes caps the starting content kept for the patch; files
	// past it are still hashed, and their changes listed but left out of
	// the patch.
	MaxBaseBytes int64
	// MaxFileBytes caps the size of one file whose content goes into the
	// patch.
	MaxFileBytes int64
	// MaxPatchBytes caps the new content put into the patch in total.
	MaxPatchBytes int64
	// MaxHashBytes caps the bytes hashed in each tree. Sparse files (far
	// larger than what the filesystem allocated for them) are never read;
	// a file past the cap is recorded without a digest, as changed.
	MaxHashBytes int64
	// HashTimeout bounds the time spent hashing each tree; files not
	// hashed by then are recorded without a digest, as changed.
	HashTimeout time.Duration
}

// DefaultLimits suit a source repository with some build output.
var DefaultLimits = Limits{
	MaxEntries:    workspace.DefaultScanMaxEntries,
	MaxBaseBytes:  1 << 30,
	MaxFileBytes:  16 << 20,
	MaxPatchBytes: 256 << 20,
	MaxHashBytes:  8 << 30,
	HashTimeout:   2 * time.Minute,
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxEntries <= 0 {
		l.MaxEntries = d.MaxEntries
	}
	if l.MaxBaseBytes <= 0 {
		l.MaxBaseBytes = d.MaxBaseBytes
	}
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = d.MaxFileBytes
	}
	if l.MaxPatchBytes <= 0 {
		l.MaxPatchBytes = d.MaxPatchBytes
	}
	if l.MaxHashBytes <= 0 {
		l.MaxHashBytes = d.MaxHashBytes
	}
	if l.HashTimeout <= 0 {
		l.HashTimeout = d.HashTimeout
	}
	return l
}

// Git file modes, as patches and tree hashes name them.
const (
	modeFile       uint32 = 0o100644
	modeExecutable uint32 = 0o100755
	modeSymlink    uint32 = 0o120000
)

// maxIgnoreFileBytes bounds each ignore file copied into the scratch repository.
const maxIgnoreFileBytes = 1 << 20

// Names inside a baseline directory.
const (
	manifestName = "manifest.json"
	basePack     = "base.pack"
	newPack      = "new.pack"
	ignoreRepo   = "ignore"
)

// entry is one file or symlink of a tree.
type entry struct {
	Path   string `json:"path"`
	Mode   uint32 `json:"mode"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// NotHashed says why a file has no SHA256 (a sparse file, or over
	// MaxHashBytes or HashTimeout): it cannot be compared.
	NotHashed string `json:"not_hashed,omitempty"`
	// Target is a symlink's target.
	Target string `json:"target,omitempty"`
	// Kept says the content is in the baseline's pack, at Offset.
	Kept   bool  `json:"kept,omitempty"`
	Offset int64 `json:"offset,omitempty"`
}

// manifest is the starting tree as Snapshot recorded it.
type manifest struct {
	Home       string               `json:"home"`
	Limits     Limits               `json:"limits"`
	Git        bool                 `json:"git"`
	BaseCommit string               `json:"base_commit,omitempty"`
	Tracked    []string             `json:"tracked,omitempty"`
	Entries    []entry              `json:"entries"`
	Scan       workspace.ScanReport `json:"scan"`
	Notes      []string             `json:"notes,omitempty"`
	// Exclude are the patterns left out of both trees.
	Exclude []string `json:"exclude,omitempty"`
}

// Options configure Snapshot.
type Options struct {
	// Workspace is the host's own copy of the workspace the home was made
	// from. When it is a git work tree (it has a .git entry), the change
	// set records its HEAD as the base commit and leaves out what its
	// ignore rules ignore. Git runs only on this copy, never on the home.
	Workspace string
	// Limits bound the scans and the patch.
	Limits Limits
	// Exclude are patterns (relative to home, in the syntax of
	// workspace.DefaultExcludes) left out of both trees: the agent's own
	// state, which is no change to the user's code. Nil means
	// DefaultExcludes; an empty, non-nil slice excludes nothing.
	Exclude []string
}

// DefaultExcludes are the change set's default Options.Exclude: the state
// directory of taskrun's reference agent.
var DefaultExcludes = []string{".taskrun-agent"}

// LabelExclude is the image label with which an agent image names paths
// (caches, its own state) that are no change to the user's code: a list of
// patterns, relative to home, in the syntax of Options.Exclude, separated
// by commas or white space, such as ".cache, .npm, **/__pycache__". A run
// of the image leaves them out of its change set, in addition to the run's
// own excludes; the change set lists every pattern it applied.
const LabelExclude = "dev.taskrun.changes.exclude"

// maxLabelExcludes bounds the patterns an image label may give.
const maxLabelExcludes = 64

// ImageExcludes returns the patterns an image's LabelExclude gives (none
// without the label), checked as Options.Exclude is.
func ImageExcludes(labels map[string]string) ([]string, error) {
	v, ok := labels[LabelExclude]
	if !ok {
		return nil, nil
	}
	patterns := strings.FieldsFunc(v, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
	if len(patterns) > maxLabelExcludes {
		return nil, fmt.Errorf("changeset: image label %s gives %d patterns, more than %d", LabelExclude, len(patterns), maxLabelExcludes)
	}
	if _, err := workspace.Matcher(patterns); err != nil {
		return nil, fmt.Errorf("changeset: image label %s: %w", LabelExclude, err)
	}
	return patterns, nil
}

// WithImageExcludes is the run's excludes (nil: DefaultExcludes) followed
// by the image's, without repeats.
func WithImageExcludes(run, image []string) []string {
	if len(image) == 0 {
		return run
	}
	if run == nil {
		run = DefaultExcludes
	}
	out := slices.Clone(run)
	for _, p := range image {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// scanExclude is the scans' filter: .git directories and what the manifest
// excludes.
func scanExclude(patterns []string) (func(rel string) bool, error) {
	match, err := workspace.Matcher(patterns)
	if err != nil {
		return nil, fmt.Errorf("changeset: %w", err)
	}
	return func(rel string) bool { return isGitDir(rel) || match(rel) }, nil
}

// Snapshot records the starting tree of home in baseDir, an empty or
// missing directory private to the executor: the path, git mode, size and
// SHA-256 of every file and symlink (symlinks are never followed), and a
// copy of the files' content, up to Limits.MaxBaseBytes, for the patch.
// Call it after the home is materialized and before the agent starts.
//
// Directories named ".git" are left out at every depth: they are the
// repository, not its content, and a patch cannot carry them. So is what
// opts.Exclude names, in both trees.
func Snapshot(ctx context.Context, home, baseDir string, opts Options) error {
	lim := opts.Limits.withDefaults()
	if err := os.MkdirAll(baseDir, 0o700); err != nil {
		return fmt.Errorf("changeset: snapshot: %w", err)
	}
	pack, err := os.OpenFile(filepath.Join(baseDir, basePack), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("changeset: snapshot: %w", err)
	}
	defer pack.Close()
	pw := bufio.NewWriterSize(pack, 256<<10)
	m := manifest{Home: home, Limits: lim, Exclude: opts.Exclude}
	if m.Exclude == nil {
		m.Exclude = DefaultExcludes
	}
	exclude, err := scanExclude(m.Exclude)
	if err != nil {
		return err
	}
	var kept int64
	budget, cancel := newHashBudget(ctx, lim)
	defer cancel()
	report, err := workspace.Scan(ctx, home, workspace.ScanOptions{Exclude: exclude, MaxEntries: lim.MaxEntries},
		func(ctx context.Context, e workspace.ScanEntry) error {
			en := entry{Path: e.RelPath, Mode: gitMode(e.Mode), Size: e.Size}
			if e.Reader == nil {
				en.Target = e.Target
				en.SHA256 = sha256Hex([]byte(e.Target))
				m.Entries = append(m.Entries, en)
				return nil
			}
			keep := e.Size <= lim.MaxBaseBytes-kept
			var dst io.Writer = io.Discard
			if keep {
				dst = pw
			}
			n, digest, notHashed, err := budget.hash(ctx, e, dst)
			if keep {
				en.Kept, en.Offset = notHashed == "", kept
				kept += n
			}
			if err != nil {
				return err
			}
			en.SHA256, en.NotHashed = digest, notHashed
			m.Entries = append(m.Entries, en)
			return nil
		})
	if err != nil {
		return fmt.Errorf("changeset: snapshot: %w", err)
	}
	if err := errors.Join(pw.Flush(), pack.Close()); err != nil {
		return fmt.Errorf("changeset: snapshot: %w", err)
	}
	m.Scan = report
	if kept < sumSizes(m.Entries) {
		m.Notes = append(m.Notes, fmt.Sprintf("starting content over %d bytes (MaxBaseBytes) not kept: changes to those files are listed but not in the patch", lim.MaxBaseBytes))
	}
	if opts.Workspace != "" && isGitWorkTree(opts.Workspace) {
		if err := snapshotGit(ctx, opts.Workspace, baseDir, &m); err != nil {
			return fmt.Errorf("changeset: snapshot: %w", err)
		}
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("changeset: snapshot: %w", err)
	}
	if err := os.WriteFile(filepath.Join(baseDir, manifestName), raw, 0o600); err != nil {
		return fmt.Errorf("changeset: snapshot: %w", err)
	}
	return nil
}

// snapshotGit records the base commit and the paths it tracks, and builds
// the scratch repository holding the starting tree's ignore rules. Rules are
// taken from the start, so an agent cannot hide a new file by editing
// .gitignore.
func snapshotGit(ctx context.Context, workTree, baseDir string, m *manifest) error {
	m.Git = true
	commit, err := baseCommit(ctx, workTree)
	if err != nil {
		return err
	}
	m.BaseCommit = commit
	if m.Tracked, err = trackedPaths(ctx, workTree, commit); err != nil {
		return err
	}
	scratch := filepath.Join(baseDir, ignoreRepo)
	if err := initScratchRepo(ctx, scratch); err != nil {
		return err
	}
	if err := copyExcludeFile(workTree, scratch); err != nil {
		return err
	}
	pack, err := os.Open(filepath.Join(baseDir, basePack))
	if err != nil {
		return err
	}
	defer pack.Close()
	dst, err := os.OpenRoot(scratch)
	if err != nil {
		return err
	}
	defer dst.Close()
	for _, e := range m.Entries {
		if path.Base(e.Path) != ".gitignore" || e.Target != "" || !e.Kept || e.Size > maxIgnoreFileBytes {
			continue
		}
		f, err := createIn(dst, e.Path)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, io.NewSectionReader(pack, e.Offset, e.Size))
		if err := errors.Join(err, f.Close()); err != nil {
			return err
		}
	}
	return nil
}

// createIn creates rel (and its parents) inside root.
func createIn(root *os.Root, rel string) (*os.File, error) {
	if dir := path.Dir(rel); dir != "." {
		if err := root.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	return root.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
}

// isGitDir reports whether rel is a directory entry named .git.
func isGitDir(rel string) bool {
	return path.Base(rel) == ".git"
}

// gitMode maps a file mode to the mode git records.
func gitMode(m fs.FileMode) uint32 {
	switch {
	case m&fs.ModeSymlink != 0:
		return modeSymlink
	case m.Perm()&0o111 != 0:
		return modeExecutable
	default:
		return modeFile
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func sumSizes(es []entry) int64 {
	var n int64
	for _, e := range es {
		if e.Target == "" {
			n += e.Size
		}
	}
	return n
}

// loadManifest reads the manifest Snapshot wrote in baseDir.
func loadManifest(baseDir string) (*manifest, error) {
	raw, err := os.ReadFile(filepath.Join(baseDir, manifestName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("changeset: %s holds no snapshot: call Snapshot before the agent starts: %w", baseDir, err)
	}
	if err != nil {
		return nil, err
	}
	var m manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("changeset: decode snapshot manifest: %w", err)
	}
	return &m, nil
}

// modeString formats a git mode as patches do.
func modeString(m uint32) string {
	return fmt.Sprintf("%06o", m)
}
