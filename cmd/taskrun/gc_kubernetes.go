package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/sandbox/kubernetes"
)

// gcKubeFlags name the Kubernetes namespace whose leftover run Pods gc also
// removes, with their NetworkPolicies.
type gcKubeFlags struct {
	kubeconfig string
	namespace  string
}

// define adds the flags to fs.
func (f *gcKubeFlags) define(fs *pflag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "with --namespace: the cluster's kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
	fs.StringVar(&f.namespace, "namespace", "", "also remove the run Pods (and their NetworkPolicies) in this Kubernetes namespace whose executor is gone")
}

// reap removes the Pods of the namespace whose executor host finds gone
// (every finished Pod too with all); nothing without --namespace.
func (f *gcKubeFlags) reap(ctx context.Context, a *app, host *executor.Host, grace time.Duration, all, dryRun bool) (kubernetes.ReapReport, error) {
	if f.namespace == "" {
		return kubernetes.ReapReport{}, nil
	}
	cfg, err := kubernetes.ConfigFromKubeconfig(f.kubeconfig)
	if err != nil {
		return kubernetes.ReapReport{}, fmt.Errorf("gc pods: %w", err)
	}
	b, err := kubernetes.New(ctx, cfg, f.namespace, kubernetes.WithLogger(a.log), kubernetes.WithInstance("gc"))
	if err != nil {
		return kubernetes.ReapReport{}, fmt.Errorf("gc pods: %w", err)
	}
	rep, err := b.Reap(ctx, kubernetes.ReapOptions{Grace: grace, All: all, DryRun: dryRun, ExecutorGone: host.ExecutorProcessGone})
	if err != nil {
		return rep, fmt.Errorf("gc pods in namespace %s: %w", f.namespace, err)
	}
	return rep, nil
}
