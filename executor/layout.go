package executor

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/workspace"
)

// HelpersDirName holds, under the runs root, the helper files unpacked from
// the taskrun binary (helpers.FromExecutable).
const HelpersDirName = "helpers"

// UIDsDirName holds, under the runs root, the uid leases of an executor
// that does not run as root (root shares uidpool.DefaultDir with every
// executor of the host).
const UIDsDirName = "uids"

// WorkerWorkspacesDirName holds, under the runs root, the workspaces a
// worker downloaded for its leased runs.
const WorkerWorkspacesDirName = "worker-workspaces"

// Layout is the runs root: everything an executor keeps on the host lives
// under it, at the places its methods name.
//
//	ROOT/users/...            run directories (workspace.Paths)
//	ROOT/journal/             the runs' crash journal
//	ROOT/pool/                warm pool slots
//	ROOT/executors/           executor instance locks
//	ROOT/diskcap/             disk cap templates and images
//	ROOT/helpers/             helpers unpacked from the taskrun binary
//	ROOT/uids/                uid leases (not as root: uidpool.DefaultDir)
//	ROOT/worker-workspaces/   workspaces a worker downloaded
type Layout struct {
	root string
}

// NewLayout returns the layout of the runs root dir, made absolute. It
// creates nothing; see Create.
func NewLayout(dir string) (Layout, error) {
	if dir == "" {
		return Layout{}, fmt.Errorf("executor: empty runs root: give a directory such as %s", filepath.Join(os.TempDir(), "taskrun"))
	}
	root, err := filepath.Abs(dir)
	if err != nil {
		return Layout{}, fmt.Errorf("executor: runs root %q: %w", dir, err)
	}
	return Layout{root: root}, nil
}

// Create makes the runs root if it does not exist.
func (l Layout) Create() error {
	if err := os.MkdirAll(l.root, 0o755); err != nil {
		return fmt.Errorf("executor: runs root: %w", err)
	}
	return nil
}

// Root is the runs root, an absolute path.
func (l Layout) Root() string { return l.root }

// Paths is the layout of the run directories under the root.
func (l Layout) Paths() *workspace.Paths { return workspace.NewPaths(l.root) }

// JournalDir is the runs' crash journal.
func (l Layout) JournalDir() string { return filepath.Join(l.root, JournalDirName) }

// OpenJournal opens (creating it) the runs' crash journal.
func (l Layout) OpenJournal() (*journal.Dir, error) { return OpenRunJournal(l.root) }

// PoolDir is the warm pool's directory (warmpool.Config.Dir).
func (l Layout) PoolDir() string { return PoolDir(l.root) }

// ExecutorsDir holds the executor instances' lock files.
func (l Layout) ExecutorsDir() string { return filepath.Join(l.root, ExecutorsDirName) }

// StartInstance starts this process's executor instance: its lock under
// ExecutorsDir, which proves it alive to every other executor of the root.
func (l Layout) StartInstance() (*instance.Instance, error) { return instance.Start(l.ExecutorsDir()) }

// DiskCapTemplatesDir holds the disk caps' pre-formatted templates
// (warmpool.Config.DiskCapTemplates).
func (l Layout) DiskCapTemplatesDir() string { return DiskCapTemplatesDir(l.root) }

// DiskCapImagesDir holds the disk caps' images, swept once no run dir
// names them.
func (l Layout) DiskCapImagesDir() string {
	return filepath.Join(l.DiskCapTemplatesDir(), diskcap.ImagesDirName)
}

// HelpersDir is where the helpers installed with the taskrun binary are
// unpacked (the cache dir of helpers.FromExecutable).
func (l Layout) HelpersDir() string { return filepath.Join(l.root, HelpersDirName) }

// UIDLeaseDir is where uid leases live: shared by every executor of the
// host when this process runs as root (uidpool.DefaultDir), else under the
// root.
func (l Layout) UIDLeaseDir() string {
	if os.Geteuid() == 0 {
		return uidpool.DefaultDir
	}
	return filepath.Join(l.root, UIDsDirName)
}

// WorkerWorkspacesDir holds the workspaces a worker downloaded.
func (l Layout) WorkerWorkspacesDir() string { return filepath.Join(l.root, WorkerWorkspacesDirName) }
