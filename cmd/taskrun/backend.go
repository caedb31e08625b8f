package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/kubernetes"
)

// Backends `taskrun run --backend` selects.
const (
	backendDocker     = "docker"
	backendKubernetes = "kubernetes"
)

// agentCommand is the reference agent image's command.
const agentCommand = "/usr/local/bin/taskrun-agent"

// backendFlags choose and configure the sandbox backend of a run.
type backendFlags struct {
	backend        string
	kubeconfig     string
	namespace      string
	helperImage    string
	runtimeClasses []string
	seccompProfile string
	// allowUnrestricted lets runs start in a namespace not enforcing Pod
	// Security "restricted".
	allowUnrestricted bool
	// kubeletPort is the nodes' kubelet port the self-check probes.
	kubeletPort int
}

// define adds the backend flags to fs.
func (f *backendFlags) define(fs *pflag.FlagSet) {
	fs.StringVar(&f.backend, "backend", backendDocker, `where the run's sandbox runs: "docker" (this host's engine) or "kubernetes" (a Pod in --namespace)`)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "with --backend kubernetes: the cluster's kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
	fs.StringVar(&f.namespace, "namespace", "", `with --backend kubernetes: the namespace of the run's Pod (enforce Pod Security "restricted" there)`)
	fs.StringVar(&f.helperImage, "helper-image", kubernetes.DefaultHelperImage, "with --backend kubernetes: the helper image, loaded on the cluster's nodes (taskrun images build makes it)")
	fs.StringArrayVar(&f.runtimeClasses, "runtime-class", nil, "with --backend kubernetes: RUNTIME=CLASS maps --runtime to a RuntimeClass, e.g. runsc=gvisor; repeatable")
	fs.BoolVar(&f.allowUnrestricted, "allow-unrestricted-namespace", false, `with --backend kubernetes: run even where --namespace does not enforce Pod Security "restricted" (logged as a warning at each run)`)
	fs.IntVar(&f.kubeletPort, "kubelet-port", kubernetes.KubeletPort, "with --backend kubernetes: the nodes' kubelet port; every run's self-check connects to it on its node and fails the run if it connects")
	fs.StringVar(&f.seccompProfile, "seccomp-localhost", "", "with --backend kubernetes: taskrun's seccomp profile as installed on the nodes (relative to the kubelet's seccomp dir); default: the runtime's default profile")
}

// check refuses flags that do not fit the chosen backend.
func (f *backendFlags) check() error {
	switch f.backend {
	case backendDocker:
		if f.namespace != "" || f.kubeconfig != "" || f.allowUnrestricted {
			return fmt.Errorf("--namespace, --kubeconfig and --allow-unrestricted-namespace need --backend kubernetes")
		}
	case backendKubernetes:
		if f.namespace == "" {
			return fmt.Errorf("--backend kubernetes needs --namespace NS")
		}
		for _, rc := range f.runtimeClasses {
			if rt, class, ok := strings.Cut(rc, "="); !ok || rt == "" || class == "" {
				return fmt.Errorf("--runtime-class %q: give RUNTIME=CLASS, e.g. runsc=gvisor", rc)
			}
		}
	default:
		return fmt.Errorf("--backend %q: give docker or kubernetes", f.backend)
	}
	return nil
}

// kubernetesBackend connects the Kubernetes backend the flags describe.
func (f *backendFlags) kubernetesBackend(ctx context.Context, log *slog.Logger, instanceID string, extra ...kubernetes.Option) (*kubernetes.Backend, error) {
	cfg, err := kubernetes.ConfigFromKubeconfig(f.kubeconfig)
	if err != nil {
		return nil, err
	}
	opts := []kubernetes.Option{
		kubernetes.WithLogger(log),
		kubernetes.WithInstance(instanceID),
		kubernetes.WithHelperImage(f.helperImage),
		kubernetes.WithSeccompLocalhost(f.seccompProfile),
		kubernetes.WithAllowUnrestrictedNamespace(f.allowUnrestricted),
		kubernetes.WithKubeletPort(f.kubeletPort),
	}
	for _, rc := range f.runtimeClasses {
		rt, class, _ := strings.Cut(rc, "=")
		opts = append(opts, kubernetes.WithRuntimeClass(rt, class))
	}
	return kubernetes.New(ctx, cfg, f.namespace, append(opts, extra...)...)
}

var _ sandbox.Backend = (*kubernetes.Backend)(nil)
