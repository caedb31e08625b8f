package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/taskrun/taskrun/sandbox"
)

// DefaultReapGrace spares Pods younger than this: a run being started by
// another executor may not be registered anywhere yet.
const DefaultReapGrace = time.Minute

// reasonDeadlineExceeded is the Pod status reason of a Pod the kubelet
// stopped at its activeDeadlineSeconds.
const reasonDeadlineExceeded = "DeadlineExceeded"

// ReapOptions narrows and tunes a Reap, as for the Docker backend.
type ReapOptions struct {
	// Labels restricts the reaper to Pods that also carry all of these labels.
	Labels map[string]string
	// Grace spares Pods created less than Grace ago; 0 means DefaultReapGrace.
	Grace time.Duration
	// DryRun reports what would be removed without removing anything.
	DryRun bool
	// All considers every managed Pod in the namespace, whoever created it.
	// By default only Pods of this backend's instance and of executors that
	// ExecutorGone proves gone are considered.
	All bool
	// ExecutorGone reports whether the executor instance id is provably
	// gone. process is the executor's process record from the Pod
	// (WithInstanceProcess) when the Pod was created on this host, else "".
	ExecutorGone func(id, process string) (gone bool, why string)
	// ExpiredLeasesOnly removes only the runs whose Lease expired (and
	// expired Leases without a Pod), whatever else holds: what a live
	// executor reaps while it runs (Backend.reapExpired).
	ExpiredLeasesOnly bool
}

// ReapedPod is a Pod Reap removed (or would remove in a dry run).
type ReapedPod struct {
	Name   string `json:"name"`
	RunID  string `json:"run_id,omitempty"`
	Phase  string `json:"phase"`
	Reason string `json:"reason"`
}

// ReapReport says what a Reap found.
type ReapReport struct {
	Removed []ReapedPod `json:"removed"`
	Spared  int         `json:"spared"`
	// Leases names the expired run Leases removed (or to be removed) that
	// had no Pod.
	Leases []string `json:"leases,omitempty"`
}

// ownedByALease reports whether the Pod names a Lease as its owner (a Pod
// created before runs had Leases names none).
func ownedByALease(pod *corev1.Pod) bool {
	for _, r := range pod.OwnerReferences {
		if r.Kind == "Lease" && r.APIVersion == coordinationv1.SchemeGroupVersion.String() {
			return true
		}
	}
	return false
}

// Reap deletes the runs (Lease, Pod and NetworkPolicy) that no live run
// owns. A run whose Lease expired (its executor stopped renewing it: killed,
// or cut from the API server past the Lease's duration), a Pod whose Lease
// is gone, a Pod of an executor proven gone, or one the cluster stopped at
// its active deadline, is removed whatever created it; otherwise a Pod is
// owned by a live run when this Backend holds a handle for it, or when it
// is not finished and not past its dev.taskrun.expires time. Pods younger
// than the grace period are spared unless their Lease expired. A Lease
// whose Pod is gone is deleted once expired.
func (b *Backend) Reap(ctx context.Context, opts ReapOptions) (ReapReport, error) {
	if opts.Grace <= 0 {
		opts.Grace = DefaultReapGrace
	}
	sel := map[string]string{sandbox.LabelManaged: "true"}
	maps.Copy(sel, opts.Labels)
	selector := labels.SelectorFromSet(sel).String()
	pods, err := b.client.pods(b.namespace).List(ctx, selector)
	if err != nil {
		return ReapReport{}, err
	}
	leaseList, err := b.client.leases(b.namespace).List(ctx, selector)
	if err != nil {
		return ReapReport{}, fmt.Errorf("list leases: %w", err)
	}
	leases := make(map[string]*coordinationv1.Lease, len(leaseList.Items))
	for i := range leaseList.Items {
		leases[leaseList.Items[i].Name] = &leaseList.Items[i]
	}
	now := b.now()
	var rep ReapReport
	var errs []error
	for i := range pods.Items {
		pod := &pods.Items[i]
		lease := leases[pod.Name]
		delete(leases, pod.Name)
		reason, remove := b.reapReason(pod, lease, opts, now)
		if !remove {
			rep.Spared++
			continue
		}
		rep.Removed = append(rep.Removed, ReapedPod{Name: pod.Name, RunID: pod.Annotations[sandbox.LabelRun], Phase: string(pod.Status.Phase), Reason: reason})
		if !opts.DryRun {
			if err := b.deleteRun(ctx, pod.Name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// The Leases left have no Pod: a start that died before creating it,
	// or a run whose Pod is already deleted.
	for name, lease := range leases {
		if b.isLive(name) || !now.After(leaseExpiry(lease)) {
			continue
		}
		rep.Leases = append(rep.Leases, name)
		if !opts.DryRun {
			if err := b.deleteRun(ctx, name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	slices.Sort(rep.Leases)
	return rep, errors.Join(errs...)
}

// reapReason says whether pod, whose Lease is lease (nil if none), is to be
// removed, and why.
func (b *Backend) reapReason(pod *corev1.Pod, lease *coordinationv1.Lease, opts ReapOptions, now time.Time) (string, bool) {
	if b.isLive(pod.Name) {
		return "", false
	}
	if lease != nil {
		if exp := leaseExpiry(lease); now.After(exp) {
			return "its lease expired at " + exp.UTC().Format(time.RFC3339) + ": its executor stopped renewing it", true
		}
	}
	if opts.ExpiredLeasesOnly || now.Sub(pod.CreationTimestamp.Time) < opts.Grace {
		return "", false
	}
	if lease == nil && ownedByALease(pod) {
		return "its lease is gone", true
	}
	inst := pod.Labels[sandbox.LabelInstance]
	if inst != "" && inst != b.instance && opts.ExecutorGone != nil {
		process := ""
		if b.host != "" && pod.Annotations[LabelInstanceHost] == b.host {
			process = pod.Annotations[sandbox.LabelInstanceProcess]
		}
		if gone, why := opts.ExecutorGone(inst, process); gone {
			return "executor " + inst + " is gone: " + why, true
		}
	}
	if pod.Status.Phase == corev1.PodFailed && pod.Status.Reason == reasonDeadlineExceeded {
		// The cluster stopped it at its active deadline, which lies past
		// everything its executor may still spend on the run: whoever
		// created it, no run holds it any more.
		return "stopped by the cluster at its active deadline", true
	}
	if !opts.All && (inst == "" || inst != b.instance) {
		return "", false
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return "finished and no live run holds it", true
	}
	if st := containerStatus(pod, ContainerRun); st != nil && st.State.Terminated != nil {
		return "run container exited and no live run holds it", true
	}
	if inst != "" && inst == b.instance {
		return "created by this executor and not held by any of its runs", true
	}
	if exp, err := time.Parse(time.RFC3339, pod.Annotations[sandbox.LabelExpires]); err == nil && now.After(exp) {
		return "past its expiry " + exp.Format(time.RFC3339), true
	}
	return "", false
}

// ListManaged returns the names of the managed Pods, NetworkPolicies (as
// networkpolicy/NAME) and Leases (as lease/NAME) carrying all of sel,
// sorted.
func (b *Backend) ListManaged(ctx context.Context, sel map[string]string) ([]string, error) {
	all := map[string]string{sandbox.LabelManaged: "true"}
	maps.Copy(all, sel)
	s := labels.SelectorFromSet(all).String()
	pods, err := b.client.pods(b.namespace).List(ctx, s)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pods.Items {
		out = append(out, p.Name)
	}
	nps, err := b.client.networkPolicies(b.namespace).List(ctx, s)
	if err != nil {
		return nil, err
	}
	for _, np := range nps.Items {
		out = append(out, "networkpolicy/"+np.Name)
	}
	leases, err := b.client.leases(b.namespace).List(ctx, s)
	if err != nil {
		return nil, err
	}
	for _, l := range leases.Items {
		out = append(out, "lease/"+l.Name)
	}
	slices.Sort(out)
	return out, nil
}

// reapExpired removes the runs whose Lease expired, at most once per Lease
// duration per Backend: every live run's Lease renewal calls it, so while
// any executor runs Pods in the namespace, a killed executor's runs are
// removed within about two Lease durations, with no executor starting.
func (b *Backend) reapExpired(ctx context.Context) {
	b.mu.Lock()
	now := b.now()
	due := now.Sub(b.lastReap) >= b.leaseDuration
	if due {
		b.lastReap = now
	}
	b.mu.Unlock()
	if !due {
		return
	}
	rep, err := b.Reap(ctx, ReapOptions{ExpiredLeasesOnly: true})
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("reap runs whose lease expired", "namespace", b.namespace, "err", err)
		}
		return
	}
	for _, p := range rep.Removed {
		b.log.Info("removed a run whose lease expired", "pod", p.Name, "run", p.RunID, "why", p.Reason)
	}
}
