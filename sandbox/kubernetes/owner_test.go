package kubernetes

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/taskrun/taskrun/sandbox"
)

// ownerAPI is an httptest API server that stores the created Pod (with a
// UID) and NetworkPolicy, and reports the Pod failed, so a start stops
// right after creating them.
type ownerAPI struct {
	mu       sync.Mutex
	requests []string
	lease    *coordinationv1.Lease
	pod      *corev1.Pod
	policy   *networkingv1.NetworkPolicy
	// loseFirstCreate stores the first created Pod but answers 504.
	loseFirstCreate bool
}

func (f *ownerAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path)
	w.Header().Set("Content-Type", "application/json")
	status := func(code int, reason metav1.StatusReason) {
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Code: int32(code), Reason: reason})
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/ns/pods":
		if f.pod != nil {
			status(http.StatusConflict, metav1.StatusReasonAlreadyExists)
			return
		}
		var pod corev1.Pod
		if err := json.NewDecoder(r.Body).Decode(&pod); err != nil {
			status(http.StatusBadRequest, metav1.StatusReasonBadRequest)
			return
		}
		pod.UID = types.UID("uid-of-" + pod.Name)
		f.pod = &pod
		if f.loseFirstCreate {
			status(http.StatusGatewayTimeout, metav1.StatusReasonTimeout)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(pod)
	case r.Method == http.MethodPost && r.URL.Path == "/apis/coordination.k8s.io/v1/namespaces/ns/leases":
		var l coordinationv1.Lease
		if err := json.NewDecoder(r.Body).Decode(&l); err != nil {
			status(http.StatusBadRequest, metav1.StatusReasonBadRequest)
			return
		}
		l.UID = types.UID("uid-of-lease-" + l.Name)
		f.lease = &l
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(l)
	case r.Method == http.MethodPost && r.URL.Path == "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies":
		var np networkingv1.NetworkPolicy
		if err := json.NewDecoder(r.Body).Decode(&np); err != nil {
			status(http.StatusBadRequest, metav1.StatusReasonBadRequest)
			return
		}
		f.policy = &np
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(np)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/ns/pods/") && f.pod != nil:
		pod := f.pod.DeepCopy()
		pod.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
		pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Refused", Message: "by the test"}
		_ = json.NewEncoder(w).Encode(pod)
	case r.Method == http.MethodDelete:
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess})
	default:
		status(http.StatusNotFound, metav1.StatusReasonNotFound)
	}
}

// startAgainst runs a handle's start against f until the Pod is reported
// failed.
func startAgainst(t *testing.T, f *ownerAPI) {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	cfg := &rest.Config{Host: srv.URL}
	c, err := newClient(cfg)
	require.NoError(t, err)
	b := &Backend{client: c, config: cfg, namespace: "ns", log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		apiOutage: 20 * time.Second, startTimeout: time.Minute, now: time.Now, live: map[string]*handle{}}
	pc := testConfig()
	pc.Namespace = "ns"
	cv := mustConvert(t, testSpec(), sandbox.DefaultPolicy(), pc)
	h := newHandle(b, cv.Pod.Name, testSpec(), sandbox.Streams{})
	defer h.release()
	require.ErrorIs(t, h.start(t.Context(), cv, nil), ErrPodFailed)
}

func TestTheLeaseOwnsThePodWhichOwnsItsNetworkPolicy(t *testing.T) {
	f := &ownerAPI{}
	startAgainst(t, f)
	require.NotNil(t, f.pod)
	require.NotNil(t, f.policy, "the policy is created")
	require.NotNil(t, f.lease, "the lease is created")
	assert.Empty(t, f.lease.OwnerReferences, "the Lease is the run's root object")
	require.Len(t, f.pod.OwnerReferences, 1)
	podRef := f.pod.OwnerReferences[0]
	assert.Equal(t, "coordination.k8s.io/v1", podRef.APIVersion)
	assert.Equal(t, "Lease", podRef.Kind)
	assert.Equal(t, f.lease.Name, podRef.Name)
	assert.Equal(t, f.lease.UID, podRef.UID, "the garbage collector matches owners by UID")
	require.Len(t, f.policy.OwnerReferences, 1)
	ref := f.policy.OwnerReferences[0]
	assert.Equal(t, "v1", ref.APIVersion)
	assert.Equal(t, "Pod", ref.Kind)
	assert.Equal(t, f.pod.Name, ref.Name)
	assert.Equal(t, f.pod.UID, ref.UID, "the garbage collector matches owners by UID")
	require.NotNil(t, ref.Controller)
	assert.True(t, *ref.Controller)
	assert.Equal(t, []string{
		"POST /apis/coordination.k8s.io/v1/namespaces/ns/leases",
		"POST /api/v1/namespaces/ns/pods",
		"POST /apis/networking.k8s.io/v1/namespaces/ns/networkpolicies",
	}, f.requests[:3], "each owner exists before what it owns")
}

func TestTheOwnerIsReadBackWhenTheCreateAnswerWasLost(t *testing.T) {
	f := &ownerAPI{loseFirstCreate: true}
	startAgainst(t, f)
	require.NotNil(t, f.policy)
	require.Len(t, f.policy.OwnerReferences, 1)
	assert.Equal(t, f.pod.UID, f.policy.OwnerReferences[0].UID)
}
