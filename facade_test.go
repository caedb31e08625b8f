package taskrun_test

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// fakeInput is a run of the fake backend's /agent/echo under a fresh runs
// root, stored in a memory store.
func fakeInput(t *testing.T, rec *controlplanetest.Recorder) (taskrun.RunTaskInput, *persist.Store) {
	t.Helper()
	store, err := persist.Open(context.Background(), "mem://")
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	fake := sandboxfake.New(sandboxfake.WithMaxStopGrace(time.Millisecond))
	fake.Install("/agent/echo", func(_ context.Context, p *sandboxfake.Process) int {
		fmt.Fprintln(p.Stdout, "hello")
		if err := p.WriteFile("/taskrun/artifacts/a.txt", []byte("a")); err != nil {
			return 1
		}
		return 0
	})
	return taskrun.RunTaskInput{
		Task: &model.Task{ID: "t", UserID: "u", ConversationID: "c"}, Run: &model.TaskRun{ID: "r1", TaskID: "t"}, SessionID: "s",
		Paths: taskrun.NewRuntimePathsFromRoot(t.TempDir()), Persist: store, ArtifactStorage: store,
		Updater: rec, StreamSender: rec, Sandbox: fake,
		Image: "fake/agent", Command: []string{"/agent/echo"}, DiskLimitBytes: -1,
		// The fake runs no helpers, and its runs need no host uid.
		NoSelfCheck: true, SharedUID: true,
	}, store
}

// The facade runs the seed's input on a host built from it: the run is
// journaled under the root of its Paths and stored in its store.
func TestRunTaskRunsOnAHostOfTheInput(t *testing.T) {
	rec := &controlplanetest.Recorder{}
	in, store := fakeInput(t, rec)
	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, out.Status)
	assert.Equal(t, "hello\n", out.Result.OutputStr)
	assert.DirExists(t, filepath.Join(in.Paths.(interface{ Root() string }).Root(), executor.JournalDirName), "journaled under the runs root")
	log, err := store.OpenRunFile(context.Background(), persist.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r1"}, taskrun.OutputLogName)
	require.NoError(t, err)
	_ = log.Close()
	assert.Equal(t, model.StatusSucceeded, rec.Patches()[len(rec.Patches())-1].Status)
}

// Input that no host can be built from is refused by the facade as the
// seed refused it: reported FAILED through the updater, with an error that
// matches ErrRunFailed and ErrInvalidInput.
func TestRunTaskReportsInputNoHostCanRunAsFailed(t *testing.T) {
	for name, change := range map[string]func(*taskrun.RunTaskInput){
		"no sandbox": func(in *taskrun.RunTaskInput) { in.Sandbox = nil },
		"no persist": func(in *taskrun.RunTaskInput) { in.Persist = nil },
		"no paths":   func(in *taskrun.RunTaskInput) { in.Paths = nil },
		"no root":    func(in *taskrun.RunTaskInput) { in.Paths = rootless{in.Paths} },
		"two helpers": func(in *taskrun.RunTaskInput) {
			in.Helpers, in.HelpersDir = map[string]string{"taskrun-probe": "/x"}, "/y"
		},
		"missing task": func(in *taskrun.RunTaskInput) { in.Task = nil },
	} {
		t.Run(name, func(t *testing.T) {
			rec := &controlplanetest.Recorder{}
			in, _ := fakeInput(t, rec)
			change(&in)
			out, err := taskrun.Execute(context.Background(), in)
			require.ErrorIs(t, err, taskrun.ErrRunFailed)
			require.ErrorIs(t, err, taskrun.ErrInvalidInput)
			assert.Equal(t, model.StatusFailed, out.Status)
			patches := rec.Patches()
			require.Len(t, patches, 1, "one FAILED report")
			assert.Equal(t, model.StatusFailed, patches[0].Status)
			require.NotNil(t, patches[0].Error)
			assert.Equal(t, out.Reason, *patches[0].Error)
		})
	}
}

// rootless is a RuntimePaths that does not say where its runs root is.
type rootless struct{ taskrun.RuntimePaths }

// The input's ArtifactStorage receives the files the agent delivers, also
// when its Persist keeps artifacts of its own or none at all.
func TestRunTaskKeepsTheSeedsTwoStores(t *testing.T) {
	for name, files := range map[string]func(*persist.Store) persist.PersistStorage{
		"a whole store":  func(s *persist.Store) persist.PersistStorage { return s },
		"run files only": func(s *persist.Store) persist.PersistStorage { return runFilesOnly{s} },
	} {
		t.Run(name, func(t *testing.T) {
			rec := &controlplanetest.Recorder{}
			in, store := fakeInput(t, rec)
			artifacts, err := persist.Open(context.Background(), "mem://")
			require.NoError(t, err)
			t.Cleanup(func() { _ = artifacts.Close() })
			in.Persist, in.ArtifactStorage = files(store), artifacts
			_, err = taskrun.Execute(context.Background(), in)
			require.NoError(t, err)
			ref := persist.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r1"}
			rc, err := artifacts.OpenArtifact(context.Background(), ref, "a.txt")
			require.NoError(t, err, "the artifact is in the artifact store")
			_ = rc.Close()
			_, err = store.OpenArtifact(context.Background(), ref, "a.txt")
			require.ErrorIs(t, err, persist.ErrNotFound, "and not in the run-file store")
			rc, err = store.OpenRunFile(context.Background(), ref, taskrun.OutputLogName)
			require.NoError(t, err, "the run's files are in Persist")
			_ = rc.Close()
		})
	}
}

// runFilesOnly is a PersistStorage and nothing more.
type runFilesOnly struct{ s *persist.Store }

func (r runFilesOnly) PutRunFile(ctx context.Context, ref persist.RunRef, name string, rd io.Reader, ct string) (persist.ObjectInfo, error) {
	return r.s.PutRunFile(ctx, ref, name, rd, ct)
}

func (r runFilesOnly) OpenRunFile(ctx context.Context, ref persist.RunRef, name string) (io.ReadCloser, error) {
	return r.s.OpenRunFile(ctx, ref, name)
}

func (r runFilesOnly) PutGlobalFile(ctx context.Context, userID, relPath string, rd io.Reader, ct string) (persist.ObjectInfo, error) {
	return r.s.PutGlobalFile(ctx, userID, relPath, rd, ct)
}

func (r runFilesOnly) OpenGlobalFile(ctx context.Context, userID, relPath string) (io.ReadCloser, error) {
	return r.s.OpenGlobalFile(ctx, userID, relPath)
}

// A run that names no helpers, when the running program cannot serve as
// them, is refused before any container is made: reported FAILED with a
// reason that names the fixes, never run without the self-check.
func TestRunTaskWithoutHelpersIsRefusedNamingTheFix(t *testing.T) {
	taskrun.SetFindHelpers(t, func(string) (helpers.Files, error) {
		return nil, fmt.Errorf("taskrun binary /x: %w", helpers.ErrNotStatic)
	})
	rec := &controlplanetest.Recorder{}
	in, _ := fakeInput(t, rec)
	in.NoSelfCheck = false
	out, err := taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, taskrun.ErrRunFailed)
	require.ErrorIs(t, err, taskrun.ErrInvalidInput)
	require.ErrorIs(t, err, helpers.ErrNotStatic)
	assert.Equal(t, model.StatusFailed, out.Status)
	for _, fix := range []string{"HelpersDir", "CGO_ENABLED=0", "NoSelfCheck"} {
		assert.Contains(t, out.Reason, fix)
	}
	assert.Empty(t, in.Sandbox.(*sandboxfake.Backend).Started(), "no container")
	patches := rec.Patches()
	require.Len(t, patches, 1, "one FAILED report")
	assert.Equal(t, model.StatusFailed, patches[0].Status)
	require.NotNil(t, patches[0].Error)
	assert.Equal(t, out.Reason, *patches[0].Error)
}

// Without UIDs, Helpers or HelpersDir a run's container is the one
// `taskrun run` makes by default: it leases a host uid and parks at the
// self-check of the helpers the running program provides (cached under
// the runs root); SharedUID and NoSelfCheck opt out.
func TestRunTaskDefaultsToTheCLIsMachine(t *testing.T) {
	probe := filepath.Join(t.TempDir(), helpers.ProbeName)
	var cacheDir string
	taskrun.SetFindHelpers(t, func(dir string) (helpers.Files, error) {
		cacheDir = dir
		return helpers.Files{helpers.ProbeName: probe}, nil
	})
	in, _ := fakeInput(t, &controlplanetest.Recorder{})
	in.NoSelfCheck, in.SharedUID = false, false
	tmpl, err := taskrun.WarmTemplate(context.Background(), in)
	require.NoError(t, err)
	assert.True(t, tmpl.LeaseUIDs, "a host uid per run")
	assert.Equal(t, helpers.Files{helpers.ProbeName: probe}.Mounts(), tmpl.Mounts, "the program's helpers")
	assert.Equal(t, helpers.ProbePath, tmpl.Gate, "parked at the self-check")
	assert.Equal(t, filepath.Join(in.Paths.(interface{ Root() string }).Root(), executor.HelpersDirName), cacheDir)

	in.SharedUID = true
	tmpl, err = taskrun.WarmTemplate(context.Background(), in)
	require.NoError(t, err)
	assert.False(t, tmpl.LeaseUIDs, "SharedUID: every run is Policy.User")

	in.NoSelfCheck = true
	_, err = taskrun.WarmTemplate(context.Background(), in)
	require.ErrorIs(t, err, taskrun.ErrInvalidInput, "NoSelfCheck: nothing to park at")
}
