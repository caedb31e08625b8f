package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/taskrun/taskrun/sandbox"
)

// ErrNoLivePod is wrapped by ExecInRun when the run has no running Pod in
// the backend's namespace.
var ErrNoLivePod = errors.New("no running pod")

// ExecOptions is one command run inside a live run's Pod.
type ExecOptions struct {
	// Cmd is the command and its arguments.
	Cmd []string
	// Stdin, Stdout and Stderr are the command's streams; a nil one is not
	// attached. With TTY, Stderr is merged into Stdout by the terminal.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// TTY gives the command a terminal; Sizes, when set, resizes it.
	TTY   bool
	Sizes remotecommand.TerminalSizeQueue
}

// ExecInRun runs opts.Cmd in the run container of the live Pod of the run
// runID of tenant, and returns the command's exit status. The command runs
// as the run container runs it: as the run's own user, under its seccomp
// profile, limits and no-new-privileges, with no capability added (an exec
// gets the container's security context; nothing here can widen it).
//
// The Pod is found by its annotations, which hold every run's IDs whether
// or not they are valid label values; ErrNoLivePod is wrapped when none is
// running.
func (b *Backend) ExecInRun(ctx context.Context, tenant, runID string, opts ExecOptions) (int, error) {
	if len(opts.Cmd) == 0 {
		return 0, errors.New("exec: no command given")
	}
	pod, err := b.livePodOf(ctx, tenant, runID)
	if err != nil {
		return 0, err
	}
	exec := &corev1.PodExecOptions{Container: ContainerRun, Command: opts.Cmd, TTY: opts.TTY,
		Stdin: opts.Stdin != nil, Stdout: opts.Stdout != nil, Stderr: opts.Stderr != nil && !opts.TTY}
	s := streamIO{Stdin: opts.Stdin, Stdout: opts.Stdout, Stderr: opts.Stderr, TTY: opts.TTY, Sizes: opts.Sizes}
	if opts.TTY {
		s.Stderr = nil
	}
	err = b.remote(ctx, pod, "exec", exec, s)
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit) && exit.Exited():
		return exit.ExitStatus(), nil
	default:
		return 0, err
	}
}

// livePodOf names the running Pod of the run runID of tenant.
func (b *Backend) livePodOf(ctx context.Context, tenant, runID string) (string, error) {
	sel := labels.SelectorFromSet(map[string]string{sandbox.LabelManaged: "true"}).String()
	pods, err := b.client.pods(b.namespace).List(ctx, sel)
	if err != nil {
		return "", fmt.Errorf("list pods in namespace %s: %w", b.namespace, err)
	}
	var found []string
	for _, p := range pods.Items {
		if p.Annotations[sandbox.LabelRun] != runID || p.Annotations[sandbox.LabelTenant] != tenant ||
			p.DeletionTimestamp != nil || !runContainerRunning(&p) {
			continue
		}
		found = append(found, p.Name)
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return "", fmt.Errorf("run %s: %w in namespace %s (exec needs the namespace that runs it, and a run in progress)",
			runID, ErrNoLivePod, b.namespace)
	default:
		return "", fmt.Errorf("run %s has %d running pods in namespace %s: %v", runID, len(found), b.namespace, found)
	}
}

// runContainerRunning reports whether pod's run container is running.
func runContainerRunning(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == ContainerRun {
			return cs.State.Running != nil
		}
	}
	return false
}
