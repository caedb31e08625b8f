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

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/uidpool"
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
	// uids leases each run a uid of its own, as taskrun run's --uid-range
	// default does.
	uids   *uidpool.Pool
	labels map[string]string
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
	layout, err := executor.NewLayout(dir)
	if err != nil {
		e.close()
		return nil, err
	}
	if e.uids, err = uidpool.New(layout.UIDLeaseDir(), uidpool.DefaultRange()); err != nil {
		e.close()
		return nil, err
	}
	if c.helpersDir != "" {
		if c.helpersDir, err = filepath.Abs(c.helpersDir); err != nil {
			e.close()
			return nil, err
		}
		e.c.helpersDir = c.helpersDir
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

// hostConfig is the host `taskrun run` builds, on the bench's backend and
// store with its runs under root: a uid of its own for every run (the
// default --uid-range) and the in-sandbox self-check (-helpers-dir, the
// helpers `make build` installs beside taskrun).
func (e *env) hostConfig(root string) executor.Config {
	return benchHostConfig(root, e.backend, e.store, e.uids, e.c.helpersDir, e.c.image)
}

// benchHostConfig is the one host configuration of every section and of
// the throughput child: `taskrun run`'s, on backend and store, with runs
// under root, a uid of each run's own from uids and the self-check's
// helpers from helpersDir, running image unless a spec names another.
func benchHostConfig(root string, backend sandbox.Backend, store executor.Store, uids *uidpool.Pool, helpersDir, image string) executor.Config {
	return executor.Config{
		Root: root, Backend: backend, Store: store, UIDs: uids, HelpersDir: helpersDir,
		Defaults: executor.Defaults{Image: image, Timeout: 5 * time.Minute},
		Pull:     sandbox.PullNever,
	}
}

// host builds the host of runs under root (hostConfig).
func (e *env) host(ctx context.Context, root string) (*executor.Host, error) {
	return executor.New(ctx, e.hostConfig(root))
}

// spec is a run of cmd in the bench image with the bench labels and an
// updater that keeps only the final status.
func (e *env) spec(runID string, upd executor.TaskRunUpdater, cmd ...string) executor.Spec {
	return executor.Spec{
		Task:      &model.Task{ID: "bench", UserID: "bench", ConversationID: "bench"},
		Run:       &model.TaskRun{ID: runID, TaskID: "bench"},
		SessionID: "bench",
		Updater:   upd,
		Command:   cmd,
		Labels:    e.labels,
	}
}

// runOn runs spec on h (a host of its own under root when h is nil) and
// requires it to succeed.
func (e *env) runOn(ctx context.Context, h *executor.Host, root string, spec executor.Spec) error {
	if h == nil {
		var err error
		if h, err = e.host(ctx, root); err != nil {
			return err
		}
		defer h.Close(context.WithoutCancel(ctx))
	}
	out, err := h.Run(ctx, spec)
	if err != nil {
		return err
	}
	if out.Status != model.StatusSucceeded {
		return errors.New("run " + spec.Run.ID + " ended " + string(out.Status))
	}
	return nil
}

// statusUpdater is a TaskRunUpdater that keeps the last status.
type statusUpdater struct{ last model.RunStatus }

func (u *statusUpdater) UpdateRunStatus(_ context.Context, _ string, req *workerclient.PatchTaskRunRequest) error {
	u.last = req.Status
	return nil
}
