package workspace

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/taskrun/taskrun/model"
)

// Paths computes the host layout of users, conversations, tasks and runs under
// one root directory:
//
//	ROOT/users/U/persistent
//	ROOT/users/U/conversations/C/tasks/T/runs/R/{home,artifacts,global,output}
//
// Its string methods implement taskrun.RuntimePaths. They cannot return an
// error, so they return "" when any ID is invalid (an empty path makes every
// later file operation fail instead of touching the wrong place); use Run to
// get the validation error.
type Paths struct {
	root string
}

// NewPaths returns the layout rooted at root.
func NewPaths(root string) *Paths {
	return &Paths{root: filepath.Clean(root)}
}

// Root returns the directory the layout is rooted at.
func (p *Paths) Root() string { return p.root }

// RunDirs holds the directories of one run.
type RunDirs struct {
	// Dir is the run directory, bind-mounted at /taskrun.
	Dir string
	// Home is HOME and the working directory of the agent.
	Home string
	// Artifacts holds the files the agent delivers.
	Artifacts string
	// Global is run-global storage (traces).
	Global string
	// Output holds the final answer / result file.
	Output string
}

// sandboxDirs lists the run subdirectories the sandbox user writes to.
func (d RunDirs) sandboxDirs() []string {
	return []string{d.Home, d.Artifacts, d.Global, d.Output}
}

// Run validates all four IDs and returns the run's directories. Nothing is
// created on disk; see CreateRunDirs.
func (p *Paths) Run(ref model.RunRef) (RunDirs, error) {
	if err := ref.Validate(); err != nil {
		return RunDirs{}, err
	}
	return RunDirsAt(p.runDir(ref.UserID, ref.ConversationID, ref.TaskID, ref.RunID)), nil
}

// RunDirsAt is the layout of a run directory at dir, wherever it lies (a
// warm pool's slot directory is one). Nothing is created on disk.
func RunDirsAt(dir string) RunDirs {
	return RunDirs{
		Dir:       dir,
		Home:      filepath.Join(dir, "home"),
		Artifacts: filepath.Join(dir, "artifacts"),
		Global:    filepath.Join(dir, "global"),
		Output:    filepath.Join(dir, "output"),
	}
}

func (p *Paths) userDir(userID string) string {
	return filepath.Join(p.root, "users", userID)
}

func (p *Paths) runDir(userID, conversationID, taskID, runID string) string {
	return filepath.Join(p.userDir(userID), "conversations", conversationID,
		"tasks", taskID, "runs", runID)
}

// PersistentUserDir returns ROOT/users/U/persistent, or "" if userID is invalid.
func (p *Paths) PersistentUserDir(userID string) string {
	if model.ValidateID("user", userID) != nil {
		return ""
	}
	return filepath.Join(p.userDir(userID), "persistent")
}

// RuntimeTaskRunDir returns the run directory, or "" if an ID is invalid.
func (p *Paths) RuntimeTaskRunDir(userID, conversationID, taskID, runID string) string {
	d, _ := p.Run(model.RunRef{UserID: userID, ConversationID: conversationID, TaskID: taskID, RunID: runID})
	return d.Dir
}

// RuntimeTaskRunHomeDir returns the run's home directory, or "" if an ID is invalid.
func (p *Paths) RuntimeTaskRunHomeDir(userID, conversationID, taskID, runID string) string {
	d, _ := p.Run(model.RunRef{UserID: userID, ConversationID: conversationID, TaskID: taskID, RunID: runID})
	return d.Home
}

// RuntimeTaskRunArtifactsDir returns the run's artifacts directory, or "" if an ID is invalid.
func (p *Paths) RuntimeTaskRunArtifactsDir(userID, conversationID, taskID, runID string) string {
	d, _ := p.Run(model.RunRef{UserID: userID, ConversationID: conversationID, TaskID: taskID, RunID: runID})
	return d.Artifacts
}

// RuntimeTaskRunGlobalDir returns the run's global directory, or "" if an ID is invalid.
func (p *Paths) RuntimeTaskRunGlobalDir(userID, conversationID, taskID, runID string) string {
	d, _ := p.Run(model.RunRef{UserID: userID, ConversationID: conversationID, TaskID: taskID, RunID: runID})
	return d.Global
}

// RunOutputDir returns the run's output directory, or "" if an ID is invalid.
func (p *Paths) RunOutputDir(userID, conversationID, taskID, runID string) string {
	d, _ := p.Run(model.RunRef{UserID: userID, ConversationID: conversationID, TaskID: taskID, RunID: runID})
	return d.Output
}

// Owner is a numeric uid/gid pair that files are chowned to.
type Owner struct {
	UID, GID int
}

// SandboxOwner is the unprivileged user the agent runs as inside the container.
var SandboxOwner = Owner{UID: 10001, GID: 10001}

// ErrRunDirInUse is returned by CreateRunDirs when the run directory already
// has content: run IDs are never reused.
var ErrRunDirInUse = errors.New("run directory already exists and is not empty")

// Modes used by CreateRunDirs.
const (
	// ancestorDirMode keeps ROOT/users/U/... private to the executor: it is
	// what makes the world-writable fallback for non-root executors safe.
	ancestorDirMode fs.FileMode = 0o700
	// runDirMode lets the sandbox user traverse /taskrun and read AGENTS.md.
	runDirMode fs.FileMode = 0o755
	// ownedSandboxDirMode is used when the dirs are chowned to the owner.
	ownedSandboxDirMode fs.FileMode = 0o755
	// sharedSandboxDirMode is the fallback when the executor cannot chown.
	sharedSandboxDirMode fs.FileMode = 0o777
)

// CreateRunDirs creates d.Dir and its home, artifacts, global and output
// subdirectories, and makes the four subdirectories writable by owner
// (normally SandboxOwner).
//
// Missing ancestors are created 0700 so that nobody but the executor can
// reach a run directory on the host; the bind mount does not need them to be
// traversable by the sandbox user. The run directory itself is 0755 and stays
// owned by the executor, so the agent cannot rename or replace its subdirectories.
//
// When the executor runs as root the four subdirectories are chowned to owner
// and get mode 0755. When it does not (a rootless developer setup), chown is
// impossible, so they get mode 0777 instead: the container's uid can then
// write to them, and the 0700 ancestors keep other host users out. Refusing
// would make rootless use impossible for no gain in isolation.
//
// It fails with ErrRunDirInUse if d.Dir already exists with content.
func CreateRunDirs(d RunDirs, owner Owner) error {
	if err := CreateRunDir(d); err != nil {
		return err
	}
	for _, dir := range d.sandboxDirs() {
		if err := makeSandboxDir(dir, owner); err != nil {
			return err
		}
	}
	return nil
}

// CreateRunDir creates only d.Dir (and its 0700 ancestors), empty, so that a
// size-capped filesystem can be mounted on it before CreateRunDirs fills it.
// It fails with ErrRunDirInUse if d.Dir already exists with content.
func CreateRunDir(d RunDirs) error {
	if d.Dir == "" {
		return errors.New("create run dirs: empty run directory; build RunDirs with Paths.Run")
	}
	// A run ending meanwhile may prune the ancestors it finds empty
	// (PruneRunAncestors): what vanished is made again.
	var err error
	for range maxCreateAttempts {
		if err = os.MkdirAll(filepath.Dir(d.Dir), ancestorDirMode); err != nil {
			err = fmt.Errorf("create run dirs: %w", err)
		} else {
			err = makeFreshDir(d.Dir)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	if err := os.Chmod(d.Dir, runDirMode); err != nil {
		return fmt.Errorf("create run dirs: %w", err)
	}
	return nil
}

// maxCreateAttempts bounds CreateRunDir's retries against concurrent pruning.
const maxCreateAttempts = 8

// runAncestors are the names of a run directory's ancestors in the layout
// Paths makes, from its parent up: runs, T, tasks, C, conversations, U
// (nil: a name that varies).
var runAncestors = []*string{ptr("runs"), nil, ptr("tasks"), nil, ptr("conversations"), nil}

func ptr(s string) *string { return &s }

// PruneRunAncestors removes the ancestors of a removed run directory that
// are left empty, from its runs directory up to its user's directory
// (ROOT/users stays), so that finished runs leave no empty directories
// behind. It stops at the first one that is not empty, and touches nothing
// when dir is not laid out as Paths lays out runs. A concurrent
// CreateRunDir makes again what it removed.
func PruneRunAncestors(dir string) error {
	dirs := make([]string, 0, len(runAncestors))
	for d, i := filepath.Dir(filepath.Clean(dir)), 0; i < len(runAncestors); d, i = filepath.Dir(d), i+1 {
		if want := runAncestors[i]; want != nil && filepath.Base(d) != *want {
			return nil
		}
		dirs = append(dirs, d)
	}
	if filepath.Base(filepath.Dir(dirs[len(dirs)-1])) != "users" {
		return nil
	}
	for _, d := range dirs {
		err := os.Remove(d)
		switch {
		case err == nil, errors.Is(err, fs.ErrNotExist):
		case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, fs.ErrExist):
			return nil
		default:
			return fmt.Errorf("prune run directory %s: %w", d, err)
		}
	}
	return nil
}

// makeFreshDir creates dir, accepting an existing empty directory.
func makeFreshDir(dir string) error {
	err := os.Mkdir(dir, runDirMode)
	if err == nil {
		return nil
	}
	if !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create run dirs: %w", err)
	}
	empty, err := isEmptyDir(dir)
	if err != nil {
		return fmt.Errorf("create run dirs: %w", err)
	}
	if !empty {
		return fmt.Errorf("create run dirs %s: %w; start the run under a new run ID", dir, ErrRunDirInUse)
	}
	return nil
}

// isEmptyDir reports whether path is a real directory (not a symlink) with no entries.
func isEmptyDir(path string) (bool, error) {
	info, err := os.Lstat(path)
	if err != nil {
		return false, err
	}
	if !info.IsDir() {
		return false, fmt.Errorf("%s is a %s, not a directory", path, info.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

func makeSandboxDir(dir string, owner Owner) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("create run dirs: %w", err)
	}
	mode := sharedSandboxDirMode
	if isRoot() {
		if err := os.Lchown(dir, owner.UID, owner.GID); err != nil {
			return fmt.Errorf("create run dirs: %w", err)
		}
		mode = ownedSandboxDirMode
	}
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("create run dirs: %w", err)
	}
	return nil
}

// isRoot reports whether the process can chown files to another user.
func isRoot() bool { return os.Geteuid() == 0 }

// chownable reports whether files should be chowned to o: an owner was asked
// for and the process is root.
func (o *Owner) chownable() bool { return o != nil && isRoot() }
