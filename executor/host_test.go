package executor_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/warmpool"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
	"github.com/taskrun/taskrun/workspace"
)

var discard = slog.New(slog.DiscardHandler)

func memStore(t *testing.T) *persist.Store {
	t.Helper()
	s, err := persist.Open(context.Background(), "mem://")
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestLayoutPlacesEverythingUnderTheRoot(t *testing.T) {
	_, err := executor.NewLayout("")
	require.ErrorContains(t, err, "empty runs root")

	dir := t.TempDir()
	l, err := executor.NewLayout(dir + "/./runs")
	require.NoError(t, err)
	root := filepath.Join(dir, "runs")
	assert.Equal(t, root, l.Root())
	assert.Equal(t, filepath.Join(root, "journal"), l.JournalDir())
	assert.Equal(t, executor.PoolDir(root), l.PoolDir())
	assert.Equal(t, filepath.Join(root, "executors"), l.ExecutorsDir())
	assert.Equal(t, executor.DiskCapTemplatesDir(root), l.DiskCapTemplatesDir())
	assert.Equal(t, filepath.Join(root, "diskcap", "images"), l.DiskCapImagesDir())
	assert.Equal(t, filepath.Join(root, "helpers"), l.HelpersDir())
	assert.Equal(t, filepath.Join(root, "worker-workspaces"), l.WorkerWorkspacesDir())
	if os.Geteuid() == 0 {
		assert.Equal(t, uidpool.DefaultDir, l.UIDLeaseDir(), "root shares the host's leases with every executor")
	} else {
		assert.Equal(t, filepath.Join(root, "uids"), l.UIDLeaseDir())
	}
	assert.Equal(t, filepath.Join(root, "users", "u", "conversations", "c", "tasks", "t", "runs", "r"),
		l.Paths().RuntimeTaskRunDir("u", "c", "t", "r"))

	// Nothing exists until Create, and the journal is the one the root
	// package's pipeline opens by default.
	_, err = os.Stat(root)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, l.Create())
	jd, err := l.OpenJournal()
	require.NoError(t, err)
	info, err := os.Stat(l.JournalDir())
	require.NoError(t, err)
	assert.True(t, info.IsDir())
	same, err := executor.OpenRunJournal(root)
	require.NoError(t, err)
	entry, err := jd.Create(journal.Record{RunID: "r1", UserID: "u", ConversationID: "c", TaskID: "t", StartedAt: time.Now()})
	require.NoError(t, err)
	require.NoError(t, entry.Close())
	_, err = same.Load("r1")
	require.NoError(t, err, "one journal per root")

	inst, err := l.StartInstance()
	require.NoError(t, err)
	defer inst.Close()
	gone, _, err := instance.Gone(l.ExecutorsDir(), inst.Info())
	require.NoError(t, err)
	assert.False(t, gone, "the instance is alive under the layout's executors dir")
}

// New refuses, with the fix named, every configuration that would fail or
// silently run weaker on its first run.
func TestNewRefusesABadConfig(t *testing.T) {
	ctx := context.Background()
	fake := sandboxfake.New()
	for name, tc := range map[string]struct {
		cfg  executor.Config
		want string
	}{
		"no root":           {executor.Config{Backend: fake}, "Config.Root is required"},
		"two helpers":       {executor.Config{Root: t.TempDir(), Helpers: helpers.Files{"taskrun-probe": "/x"}, HelpersDir: "/y"}, "at most one of Config.Helpers and Config.HelpersDir"},
		"negative timeout":  {executor.Config{Root: t.TempDir(), Defaults: executor.Defaults{Timeout: -time.Second}}, "Defaults.Timeout"},
		"warm, no backend":  {executor.Config{Root: t.TempDir(), HelpersDir: "/h", Executor: instance.Info{ID: "i"}, Warm: &executor.Warm{}}, "set Config.Backend"},
		"warm, no helpers":  {executor.Config{Root: t.TempDir(), Backend: fake, Executor: instance.Info{ID: "i"}, Warm: &executor.Warm{}}, "waits at the self-check"},
		"warm, no instance": {executor.Config{Root: t.TempDir(), Backend: fake, HelpersDir: "/h", Warm: &executor.Warm{}}, "set Config.Executor"},
		"warm, negative":    {executor.Config{Root: t.TempDir(), Backend: fake, HelpersDir: "/h", Executor: instance.Info{ID: "i"}, Warm: &executor.Warm{PerKey: -1}}, "give 0"},
		"warm, cannot park": {executor.Config{Root: t.TempDir(), Backend: fake, HelpersDir: "/h", Executor: instance.Info{ID: "i"}, Warm: &executor.Warm{}}, "cannot park containers"},
	} {
		t.Run(name, func(t *testing.T) {
			h, err := executor.New(ctx, tc.cfg)
			require.ErrorIs(t, err, executor.ErrConfig)
			assert.ErrorContains(t, err, tc.want)
			assert.Nil(t, h)
		})
	}
}

// A host without a backend or store (gc's, persist's) recovers but never
// runs: Run names what is missing instead of failing half-way.
func TestRecoveryHostDoesNotRun(t *testing.T) {
	ctx := context.Background()
	h, err := executor.New(ctx, executor.Config{Root: t.TempDir(), Logger: discard})
	require.NoError(t, err)
	_, err = h.Run(ctx, executor.Spec{})
	require.ErrorIs(t, err, executor.ErrConfig)
	assert.ErrorContains(t, err, "set Config.Backend")

	h, err = executor.New(ctx, executor.Config{Root: t.TempDir(), Backend: sandboxfake.New(), Logger: discard})
	require.NoError(t, err)
	_, err = h.Run(ctx, executor.Spec{})
	assert.ErrorContains(t, err, "set Config.Store")
	_, err = h.RetryPersist(ctx, executor.Spec{})
	assert.ErrorContains(t, err, "set Config.Store")
}

// The layout always has a journal: New creates the root, the journal is
// opened on first use (a refused run writes nothing), and every run's input
// names the root, whose journal the pipeline opens (no silent downgrade to
// an unjournaled run); a given journal is passed as is.
func TestNewAlwaysJournals(t *testing.T) {
	root := filepath.Join(t.TempDir(), "new-root")
	h, err := executor.New(context.Background(), executor.Config{Root: root, Backend: sandboxfake.New(), Store: memStore(t)})
	require.NoError(t, err)
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing under the root before a run")
	in := h.Input(executor.Spec{})
	assert.Equal(t, root, in.Paths.(interface{ Root() string }).Root(), "the pipeline journals under the root")
	jd, err := h.Journal()
	require.NoError(t, err)
	require.NotNil(t, jd)
	assert.DirExists(t, h.Layout().JournalDir())

	given, err := executor.NewLayout(t.TempDir())
	require.NoError(t, err)
	gj, err := given.OpenJournal()
	require.NoError(t, err)
	h, err = executor.New(context.Background(), executor.Config{Root: root, Journal: gj})
	require.NoError(t, err)
	jd, err = h.Journal()
	require.NoError(t, err)
	assert.Same(t, gj, jd)
	assert.Same(t, gj, h.Input(executor.Spec{}).Journal)
}

// Input is the host's machine and defaults under the spec's own fields;
// a spec's overrides win, its zero fields take the defaults.
func TestInputComposesHostAndSpec(t *testing.T) {
	store := memStore(t)
	fake := sandboxfake.New()
	uids, err := uidpool.New(filepath.Join(t.TempDir(), "uids"), uidpool.Range{First: 400000, Last: 400009})
	require.NoError(t, err)
	policy := sandbox.DefaultPolicy()
	policy.PidsLimit = 77
	h, err := executor.New(context.Background(), executor.Config{
		Root: t.TempDir(), Backend: fake, Store: store, StoreURL: "mem://", UIDs: uids, HelpersDir: "/helpers",
		Executor: instance.Info{ID: "exec1"}, Version: "v9", Pull: sandbox.PullNever, AllowedImages: []string{"img/*"},
		Defaults: executor.Defaults{
			Image: "img/default", Command: []string{"/agent"}, Policy: policy, Timeout: time.Minute,
			MaxOutputBytes: 1 << 20, DiskLimitBytes: 1 << 30, SessionExcludes: []string{"cache"},
		},
		ShutdownGrace: 7 * time.Second,
		ControlPlane:  &journal.ControlPlane{URL: "http://cp.test", TokenEnv: "TOK"},
		Logger:        discard,
	})
	require.NoError(t, err)

	spec := executor.Spec{
		Task: &model.Task{ID: "t", UserID: "u", ConversationID: "c"}, Run: &model.TaskRun{ID: "r"}, SessionID: "s",
		Updater: &controlplanetest.Recorder{},
	}
	in := h.Input(spec)
	assert.Equal(t, "img/default", in.Image)
	assert.Equal(t, []string{"/agent"}, in.Command)
	assert.Equal(t, policy, in.Policy)
	assert.Equal(t, time.Minute, in.Timeout)
	assert.EqualValues(t, 1<<20, in.MaxOutputBytes)
	assert.EqualValues(t, 1<<30, in.DiskLimitBytes)
	assert.Equal(t, []string{"cache"}, in.SessionExcludes)
	assert.Same(t, fake, in.Sandbox.(*sandboxfake.Backend))
	assert.Same(t, uids, in.UIDs)
	assert.Equal(t, "/helpers", in.HelpersDir)
	assert.Equal(t, "exec1", in.Executor.ID)
	assert.Equal(t, sandbox.PullNever, in.Pull)
	assert.Equal(t, []string{"img/*"}, in.AllowedImages)
	assert.Equal(t, 7*time.Second, in.ShutdownGrace)
	assert.Equal(t, "mem://", in.StoreURL)
	assert.Equal(t, "v9", in.Version)
	assert.Equal(t, &journal.ControlPlane{URL: "http://cp.test", TokenEnv: "TOK"}, in.ControlPlane)
	assert.Equal(t, h.Layout().Root(), in.Paths.(interface{ Root() string }).Root())

	// The spec's own values win; an entrypoint drops the default command.
	own := sandbox.DefaultPolicy()
	own.Runtime = "runsc"
	spec.Image, spec.Entrypoint, spec.Policy = "img/other", []string{"/bin/sh"}, &own
	spec.Timeout, spec.MaxOutputBytes, spec.DiskLimitBytes, spec.SessionExcludes = time.Second, 5, 6, []string{}
	spec.Lease = &executor.Lease{Epoch: 3, Token: "lt", Confirm: func(context.Context) error { return workerclient.ErrLeaseLost }}
	in = h.Input(spec)
	assert.Equal(t, "img/other", in.Image)
	assert.Empty(t, in.Command)
	assert.Equal(t, "runsc", in.Policy.Runtime)
	assert.Equal(t, time.Second, in.Timeout)
	assert.EqualValues(t, 5, in.MaxOutputBytes)
	assert.EqualValues(t, 6, in.DiskLimitBytes)
	assert.Empty(t, in.SessionExcludes)
	// A lease journals its fence beside the host's control plane (whose
	// own record is untouched) and fences every write.
	assert.Equal(t, &journal.ControlPlane{URL: "http://cp.test", TokenEnv: "TOK", Fence: 3, LeaseToken: "lt"}, in.ControlPlane)
	assert.Equal(t, &journal.ControlPlane{URL: "http://cp.test", TokenEnv: "TOK"}, h.Input(executor.Spec{}).ControlPlane)
	_, err = in.Persist.PutRunFile(context.Background(), persist.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r"}, "x", strings.NewReader("x"), "text/plain")
	require.NoError(t, err, "a fenced store drops writes after a lost lease, it does not fail them")
	keys, err := store.List(context.Background(), "")
	require.NoError(t, err)
	assert.Empty(t, keys, "nothing is written once the lease is lost")
}

func TestSpecValidate(t *testing.T) {
	ok := executor.Spec{
		Task: &model.Task{ID: "t", UserID: "u", ConversationID: "c"}, Run: &model.TaskRun{ID: "r", TaskID: "t"}, SessionID: "s",
		Updater: &controlplanetest.Recorder{},
	}
	require.NoError(t, ok.Validate())
	for name, change := range map[string]func(*executor.Spec){
		"no task":      func(s *executor.Spec) { s.Task = nil },
		"no updater":   func(s *executor.Spec) { s.Updater = nil },
		"bad run id":   func(s *executor.Spec) { s.Run = &model.TaskRun{ID: "../r"} },
		"other task":   func(s *executor.Spec) { s.Run = &model.TaskRun{ID: "r", TaskID: "t2"} },
		"reserved env": func(s *executor.Spec) { s.Env = []string{"HOME=/x"} },
		"no workspace": func(s *executor.Spec) { task := *s.Task; task.WorkspaceDir = "/does/not/exist"; s.Task = &task },
		"negative":     func(s *executor.Spec) { s.Timeout = -1 },
	} {
		s := ok
		change(&s)
		assert.ErrorIs(t, s.Validate(), executor.ErrInvalidInput, name)
	}
}

// Run executes a spec on the host's backend and store, journaled under its
// root, and reports through the spec's updater.
func TestRunExecutesOnTheHost(t *testing.T) {
	ctx := context.Background()
	store := memStore(t)
	fake := sandboxfake.New(sandboxfake.WithMaxStopGrace(time.Millisecond))
	fake.Install("/agent/echo", func(_ context.Context, p *sandboxfake.Process) int {
		fmt.Fprintf(p.Stdout, "hello from %s\n", p.Getenv("TASKRUN_RUN_ID"))
		return 0
	})
	h, err := executor.New(ctx, executor.Config{
		Root: t.TempDir(), Backend: fake, Store: store, Logger: discard,
		Defaults: executor.Defaults{Image: "fake/agent", DiskLimitBytes: -1, Command: []string{"/agent/echo"}},
	})
	require.NoError(t, err)
	rec := &controlplanetest.Recorder{}
	spec := executor.Spec{
		Task: &model.Task{ID: "t", UserID: "u", ConversationID: "c"}, Run: &model.TaskRun{ID: "r1", TaskID: "t"}, SessionID: "s",
		Updater: rec, StreamSender: rec,
	}
	out, err := h.Run(ctx, spec)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, out.Status)
	assert.Equal(t, "hello from r1\n", out.Result.OutputStr)
	started := fake.Started()
	require.Len(t, started, 1)
	assert.Equal(t, "fake/agent", started[0].Image)
	keys, err := store.List(ctx, "")
	require.NoError(t, err)
	assert.NotEmpty(t, keys, "the run's outputs are in the host's store")
	jd, err := h.Journal()
	require.NoError(t, err)
	recs, err := jd.List()
	require.NoError(t, err)
	assert.Empty(t, recs, "a finished run leaves no journal record")

	// The host serves the next run as well.
	rec2 := &controlplanetest.Recorder{}
	spec.Run, spec.Updater, spec.StreamSender = &model.TaskRun{ID: "r2", TaskID: "t"}, rec2, rec2
	out, err = h.Run(ctx, spec)
	require.NoError(t, err)
	assert.Equal(t, "hello from r2\n", out.Result.OutputStr)
}

// The options for what a caller brings: Paths places the run directories
// (the journal stays under Root), Artifacts takes the agents' files beside
// Store, and WarmPool is the caller's pool, which Close leaves alone.
func TestHostTakesTheCallersPathsArtifactsAndPool(t *testing.T) {
	ctx := context.Background()
	root, elsewhere := t.TempDir(), t.TempDir()
	store, artifacts := memStore(t), memStore(t)
	paths := workspace.NewPaths(elsewhere)
	h, err := executor.New(ctx, executor.Config{Root: root, Paths: paths, Backend: sandboxfake.New(), Store: store, Artifacts: artifacts, Logger: discard})
	require.NoError(t, err)
	in := h.Input(executor.Spec{})
	assert.Same(t, paths, in.Paths)
	assert.Same(t, store, in.Persist)
	assert.Same(t, artifacts, in.ArtifactStorage)

	_, err = executor.New(ctx, executor.Config{Root: root, Warm: &executor.Warm{}, WarmPool: &warmpool.Pool{}})
	require.ErrorIs(t, err, executor.ErrConfig)
	assert.ErrorContains(t, err, "at most one of Config.Warm")

	pool := &warmpool.Pool{}
	h, err = executor.New(ctx, executor.Config{Root: root, WarmPool: pool, Logger: discard})
	require.NoError(t, err)
	assert.Same(t, pool, h.WarmPool())
	assert.Same(t, pool, h.Input(executor.Spec{}).WarmPool)
	require.NoError(t, h.Close(ctx), "the caller's pool is not closed (a zero Pool would panic)")
}

// rootlessPaths is a run-directory layout that does not say where a runs
// root is.
type rootlessPaths struct{ executor.RuntimePaths }

// A run on a host with a layout of the caller's is still journaled under
// the host's Root: the root comes from the host, not from the layout.
func TestRunWithTheCallersPathsIsJournaledUnderRoot(t *testing.T) {
	ctx := context.Background()
	root, elsewhere := t.TempDir(), t.TempDir()
	fake := sandboxfake.New(sandboxfake.WithMaxStopGrace(time.Millisecond))
	var journaled bool
	fake.Install("/agent/look", func(context.Context, *sandboxfake.Process) int {
		entries, _ := os.ReadDir(filepath.Join(root, executor.JournalDirName))
		journaled = len(entries) > 0
		return 0
	})
	h, err := executor.New(ctx, executor.Config{
		Root: root, Paths: rootlessPaths{workspace.NewPaths(elsewhere)}, Backend: fake, Store: memStore(t), Logger: discard,
		Defaults: executor.Defaults{Image: "fake/agent", DiskLimitBytes: -1, Command: []string{"/agent/look"}},
	})
	require.NoError(t, err)
	out, err := h.Run(ctx, executor.Spec{
		Task: &model.Task{ID: "t", UserID: "u", ConversationID: "c"}, Run: &model.TaskRun{ID: "r1", TaskID: "t"}, SessionID: "s",
		Updater: &controlplanetest.Recorder{}, KeepRunDir: true,
	})
	require.NoError(t, err)
	assert.True(t, journaled, "the run had a journal record under Root while it ran")
	assert.True(t, strings.HasPrefix(out.Result.RunArtifactsDir, elsewhere+"/"), "the run directory is the caller's layout's: %s", out.Result.RunArtifactsDir)
}
