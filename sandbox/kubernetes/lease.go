package kubernetes

import (
	"context"
	"encoding/json"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultLeaseDuration is how long a run's Lease holds without a renewal:
// the executor renews it every third of that while it holds the run, and
// any reaper removes the run's objects once it expired.
const DefaultLeaseDuration = 45 * time.Second

// minLeaseDuration bounds WithLeaseDuration from below: a renewal must
// have time to reach the API server.
const minLeaseDuration = 3 * time.Second

// runLease is the run's owner object: a coordination.k8s.io Lease of the
// Pod's name and labels, held by the executor instance, which renews it
// while it holds the run. The Pod names it as its owner, so the cluster's
// garbage collector deletes the Pod (and, through the Pod, its
// NetworkPolicy) once the Lease is deleted, by whoever deletes it.
func runLease(cfg podConfig, podLabels map[string]string) *coordinationv1.Lease {
	d := cfg.LeaseDuration
	if d <= 0 {
		d = DefaultLeaseDuration
	}
	secs := int32((d + time.Second - 1) / time.Second)
	holder := cfg.Instance
	if holder == "" {
		holder = "taskrun"
	}
	now := metav1.NewMicroTime(cfg.Created)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Namespace: cfg.Namespace, Labels: maps.Clone(podLabels)},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: &secs,
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
}

// ownedByLease is the owner reference of a Pod to its run's Lease.
func ownedByLease(l *coordinationv1.Lease) metav1.OwnerReference {
	controller := true
	return metav1.OwnerReference{APIVersion: coordinationv1.SchemeGroupVersion.String(), Kind: "Lease",
		Name: l.Name, UID: l.UID, Controller: &controller}
}

// leaseExpiry is when the Lease expires without a further renewal: its
// last renewal (or acquisition, or creation) plus its duration.
func leaseExpiry(l *coordinationv1.Lease) time.Time {
	at := l.CreationTimestamp.Time
	switch {
	case l.Spec.RenewTime != nil:
		at = l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		at = l.Spec.AcquireTime.Time
	}
	d := DefaultLeaseDuration
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return at.Add(d)
}

// renewEvery is how often a Lease of duration d is renewed: three chances
// before it expires.
func renewEvery(d time.Duration) time.Duration {
	if d <= 0 {
		d = DefaultLeaseDuration
	}
	return d / 3
}

// renewLease renews the run's Lease every third of its duration until ctx
// ends, and after each renewal lets the backend reap the runs whose Lease
// expired (reapExpired). A renewal that fails is logged and tried again at the next tick: a
// Lease that expires meanwhile lets any reaper remove the run, which then
// fails as it would if its Pod were deleted.
func (b *Backend) renewLease(ctx context.Context, name string) {
	t := time.NewTicker(renewEvery(b.leaseDuration))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"renewTime": metav1.NewMicroTime(b.now())}})
		if err != nil {
			b.log.Error("encode lease renewal", "lease", name, "err", err)
			return
		}
		cctx, cancel := context.WithTimeout(ctx, apiCallTimeout)
		_, err = b.client.leases(b.namespace).MergePatch(cctx, name, patch)
		cancel()
		if apierrors.IsNotFound(err) {
			return // deleted: the run is over
		}
		if err != nil && ctx.Err() == nil {
			b.log.Warn("run lease not renewed; retrying at the next renewal", "lease", name, "namespace", b.namespace, "err", err)
			continue
		}
		// In the background: a slow reap must not delay this run's renewals.
		go b.reapExpired(ctx)
	}
}
