package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/workerclient"
)

// env is what every section shares: the engine, a backend, a file:// store
// and a scratch directory.
type env struct {
	c       config
	dir     string
	cli     *client.Client
	backend *docker.Backend
	store   *persist.Store
	labels  map[string]string
	// breakdown is filled by the cold CLI comparison.
	breakdown *breakdown
}

func newEnv(ctx context.Context, c config) (*env, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	if _, err := cli.ImageInspect(ctx, c.image); err != nil {
		cli.Close()
		return nil, fmt.Errorf("image %s: %w; build it with `make images`", c.image, err)
	}
	if _, err := exec.LookPath("docker"); err != nil {
		cli.Close()
		return nil, fmt.Errorf("the docker CLI is needed for the baselines: %w", err)
	}
	dir, err := os.MkdirTemp("", "taskrun-bench-")
	if err != nil {
		cli.Close()
		return nil, err
	}
	e := &env{c: c, dir: dir, cli: cli, labels: map[string]string{labelBench: c.benchID}}
	if e.backend, err = docker.New(ctx); err != nil {
		e.close()
		return nil, err
	}
	if e.store, err = persist.Open(ctx, "file://"+filepath.Join(dir, "store")); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// close removes every container of this bench and the scratch directory.
func (e *env) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if list, err := e.list(ctx); err == nil {
		for _, c := range list {
			_ = e.cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
		}
	}
	if e.backend != nil {
		e.backend.Close()
	}
	if e.store != nil {
		e.store.Close()
	}
	e.cli.Close()
	os.RemoveAll(e.dir)
}

// list returns the containers carrying this bench's label.
func (e *env) list(ctx context.Context) ([]container.Summary, error) {
	return e.cli.ContainerList(ctx, container.ListOptions{
		All: true, Filters: filters.NewArgs(filters.Arg("label", labelBench+"="+e.c.benchID)),
	})
}

// leftovers counts this bench's containers that still exist.
func (e *env) leftovers(ctx context.Context) (int, error) {
	list, err := e.list(ctx)
	return len(list), err
}

// tempDir makes a fresh directory under the scratch directory that the
// sandbox user can write to.
func (e *env) tempDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp(e.dir, prefix)
	if err != nil {
		return "", err
	}
	return dir, os.Chmod(dir, 0o777)
}

// input is a RunTask of cmd in the bench image, on the file:// store, with
// an updater that keeps only the final status.
func (e *env) input(root, runID string, upd taskrun.TaskRunUpdater, cmd ...string) taskrun.RunTaskInput {
	return taskrun.RunTaskInput{
		Task:            &model.Task{ID: "bench", UserID: "bench", ConversationID: "bench"},
		Run:             &model.TaskRun{ID: runID, TaskID: "bench"},
		SessionID:       "bench",
		Paths:           taskrun.NewRuntimePathsFromRoot(root),
		Persist:         e.store,
		ArtifactStorage: e.store,
		Updater:         upd,
		Sandbox:         e.backend,
		Image:           e.c.image,
		Command:         cmd,
		Labels:          e.labels,
		Timeout:         5 * time.Minute,
	}
}

// statusUpdater is a TaskRunUpdater that keeps the last status.
type statusUpdater struct{ last model.RunStatus }

func (u *statusUpdater) UpdateRunStatus(_ context.Context, _ string, req *workerclient.PatchTaskRunRequest) error {
	u.last = req.Status
	return nil
}

// runTask executes in and requires it to succeed.
func runTask(ctx context.Context, in taskrun.RunTaskInput) error {
	out, err := taskrun.Execute(ctx, in)
	if err != nil {
		return err
	}
	if out.Status != model.StatusSucceeded {
		return errors.New("run " + in.Run.ID + " ended " + string(out.Status))
	}
	return nil
}
