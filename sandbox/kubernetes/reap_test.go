package kubernetes

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/taskrun/taskrun/sandbox"
)

func TestReapPassesTheProcessRecordOfThisHostOnly(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	b := &Backend{instance: "me", host: "here", live: map[string]*handle{}, now: func() time.Time { return now }}
	pod := func(host string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour)),
			Labels:      map[string]string{sandbox.LabelManaged: "true", sandbox.LabelInstance: "other"},
			Annotations: map[string]string{sandbox.LabelInstanceProcess: "7/8/boot", LabelInstanceHost: host}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	var got []string
	opts := ReapOptions{Grace: time.Minute, ExecutorGone: func(id, process string) (bool, string) {
		got = append(got, id+" "+process)
		return process != "", "its process exited"
	}}
	_, remove := b.reapReason(pod("here"), nil, opts, now)
	assert.True(t, remove, "a record from this host proves the executor gone")
	_, remove = b.reapReason(pod("elsewhere"), nil, opts, now)
	assert.False(t, remove, "another host's record says nothing about this host's processes")
	assert.Equal(t, []string{"other 7/8/boot", "other "}, got)
}

func TestReapReason(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	b := &Backend{instance: "me", live: map[string]*handle{"held": nil}, now: func() time.Time { return now }}
	pod := func(name, instance string, age time.Duration, phase corev1.PodPhase, expires time.Time) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(now.Add(-age)),
			Labels: map[string]string{sandbox.LabelManaged: "true"}, Annotations: map[string]string{}},
			Status: corev1.PodStatus{Phase: phase}}
		if instance != "" {
			p.Labels[sandbox.LabelInstance] = instance
		}
		if !expires.IsZero() {
			p.Annotations[sandbox.LabelExpires] = expires.Format(time.RFC3339)
		}
		return p
	}
	gone := func(id, _ string) (bool, string) { return id == "dead", "its lock is free" }
	future, past := now.Add(time.Hour), now.Add(-time.Hour)
	tests := []struct {
		name   string
		pod    *corev1.Pod
		lease  *coordinationv1.Lease
		opts   ReapOptions
		remove bool
	}{
		{"held by a live run", pod("held", "me", time.Hour, corev1.PodRunning, past), nil, ReapOptions{All: true}, false},
		{"held by a live run, its lease expired", pod("held", "me", time.Hour, corev1.PodRunning, future), leaseRenewed(now.Add(-time.Hour)), ReapOptions{}, false},
		{"another live executor's, its lease expired", pod("l1", "alive", time.Hour, corev1.PodRunning, future), leaseRenewed(now.Add(-time.Minute)), ReapOptions{ExecutorGone: gone}, true},
		{"younger than the grace, its lease expired", pod("l2", "alive", 50*time.Second, corev1.PodRunning, future), leaseRenewed(now.Add(-46 * time.Second)), ReapOptions{ExecutorGone: gone}, true},
		{"another live executor's, its lease renewed", pod("l3", "alive", time.Hour, corev1.PodRunning, future), leaseRenewed(now.Add(-44 * time.Second)), ReapOptions{ExecutorGone: gone}, false},
		{"expired leases only: its lease expired", pod("l6", "alive", time.Hour, corev1.PodRunning, future), leaseRenewed(now.Add(-time.Minute)), ReapOptions{ExpiredLeasesOnly: true}, true},
		{"expired leases only: a finished Pod of this executor", pod("l7", "me", time.Hour, corev1.PodSucceeded, past), leaseRenewed(now), ReapOptions{ExpiredLeasesOnly: true, All: true}, false},
		{"expired leases only: executor gone", pod("l8", "dead", time.Hour, corev1.PodRunning, past), nil, ReapOptions{ExpiredLeasesOnly: true, ExecutorGone: gone}, false},
		{"its lease is gone", ownedByLeaseNamed(pod("l4", "alive", time.Hour, corev1.PodRunning, future)), nil, ReapOptions{ExecutorGone: gone}, true},
		{"its lease is gone, younger than the grace", ownedByLeaseNamed(pod("l5", "alive", time.Second, corev1.PodRunning, future)), nil, ReapOptions{ExecutorGone: gone}, false},
		{"younger than the grace", pod("young", "dead", time.Second, corev1.PodRunning, past), nil, ReapOptions{ExecutorGone: gone}, false},
		{"executor gone", pod("a", "dead", time.Hour, corev1.PodRunning, future), nil, ReapOptions{ExecutorGone: gone}, true},
		{"another live executor's", pod("b", "alive", time.Hour, corev1.PodRunning, past), nil, ReapOptions{ExecutorGone: gone}, false},
		{"this executor's, not held", pod("c", "me", time.Hour, corev1.PodRunning, future), nil, ReapOptions{}, true},
		{"no instance, not All", pod("d", "", time.Hour, corev1.PodRunning, past), nil, ReapOptions{}, false},
		{"no instance, All, expired", pod("e", "", time.Hour, corev1.PodRunning, past), nil, ReapOptions{All: true}, true},
		{"no instance, All, not expired", pod("f", "", time.Hour, corev1.PodRunning, future), nil, ReapOptions{All: true}, false},
		{"All, finished", pod("g", "alive", time.Hour, corev1.PodSucceeded, future), nil, ReapOptions{All: true}, true},
		{"another live executor's, stopped at its deadline", deadlineExceeded(pod("h", "alive", time.Hour, corev1.PodFailed, past)), nil, ReapOptions{ExecutorGone: gone}, true},
		{"another live executor's, failed otherwise", pod("i", "alive", time.Hour, corev1.PodFailed, future), nil, ReapOptions{ExecutorGone: gone}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			if opts.Grace == 0 {
				opts.Grace = DefaultReapGrace
			}
			why, remove := b.reapReason(tc.pod, tc.lease, opts, now)
			assert.Equal(t, tc.remove, remove, why)
			if remove {
				assert.NotEmpty(t, why)
			}
		})
	}
}

// deadlineExceeded marks p as stopped by the kubelet at its active deadline.
func deadlineExceeded(p *corev1.Pod) *corev1.Pod {
	p.Status.Reason = "DeadlineExceeded"
	return p
}

// leaseRenewed is a run Lease of the default duration last renewed at.
func leaseRenewed(at time.Time) *coordinationv1.Lease {
	secs := int32(DefaultLeaseDuration / time.Second)
	renewed := metav1.NewMicroTime(at)
	return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: &secs, RenewTime: &renewed}}
}

// ownedByLeaseNamed makes p a Pod owned by a Lease of its name.
func ownedByLeaseNamed(p *corev1.Pod) *corev1.Pod {
	p.OwnerReferences = []metav1.OwnerReference{ownedByLease(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: "u"}})}
	return p
}

func TestRunLeaseAndItsExpiry(t *testing.T) {
	cfg := testConfig()
	cfg.LeaseDuration = 10 * time.Second
	cv := mustConvert(t, testSpec(), sandbox.DefaultPolicy(), cfg)
	l := cv.Lease
	assert.Equal(t, cv.Pod.Name, l.Name)
	assert.Equal(t, cv.Pod.Namespace, l.Namespace)
	assert.Equal(t, cv.Pod.Labels, l.Labels, "whatever finds the Pod by label finds its Lease")
	assert.Equal(t, int32(10), *l.Spec.LeaseDurationSeconds)
	assert.Equal(t, cfg.Created.Add(10*time.Second), leaseExpiry(l))
	assert.Equal(t, cfg.Instance, *l.Spec.HolderIdentity)
	assert.Less(t, renewEvery(cfg.LeaseDuration), cfg.LeaseDuration/2, "more than one renewal per lease")
}
