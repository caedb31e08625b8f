package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskrun/taskrun/internal/kubetest"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/kubernetes"
)

// kubernetesColdRun compares a cold run of `true` on the Kubernetes backend
// (NetworkPolicy and Pod created, run dir filled, attached, gate released,
// exit observed, outputs copied back, Pod deleted) with the same run on the
// Docker backend, when the test cluster is up (make kube-up).
func kubernetesColdRun(ctx context.Context, e *env) ([]row, error) {
	what := fmt.Sprintf("cold run `true`, sandbox/kubernetes backend (median of %d)", e.c.runs)
	c, err := kubetest.Connect(ctx)
	if errors.Is(err, kubetest.ErrNoCluster) {
		return []row{{what: what, taskrun: "skipped: no test cluster (make kube-up)"}}, nil
	}
	if err != nil {
		return nil, err
	}
	kb, err := kubernetes.New(ctx, c.Config, kubetest.RunsNamespace, kubernetes.WithInstance(e.c.benchID), kubernetes.WithStopGrace(time.Second))
	if err != nil {
		return nil, err
	}
	pol := sandbox.DefaultPolicy()
	pol.NanoCPUs = 500_000_000
	ds, err := alternate(ctx, e, e.c.runs,
		func(ctx context.Context, e *env, _ int) (time.Duration, error) {
			return e.backendRun(ctx, sandbox.Streams{}, nil, "true")
		},
		func(ctx context.Context, e *env, _ int) (time.Duration, error) {
			dir, err := e.tempDir("kube-")
			if err != nil {
				return 0, err
			}
			spec := sandbox.Spec{Image: e.c.image, Cmd: []string{"true"}, Labels: e.labels, Run: model.RunRef{RunID: "bench"},
				Mounts: []sandbox.Mount{{Source: dir, Target: model.ContainerRunDir}}}
			start := time.Now()
			h, err := kb.Start(ctx, spec, pol, sandbox.Streams{})
			if err != nil {
				return 0, err
			}
			res := h.Wait(ctx)
			err = errors.Join(res.Err, h.Close(ctx))
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit code %d", res.ExitCode)
			}
			return time.Since(start), err
		},
	)
	if err != nil {
		return nil, err
	}
	return []row{ratioRow(what, median(ds[1]), median(ds[0]), "sandbox/docker backend", 0)}, nil
}
