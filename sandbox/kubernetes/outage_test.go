package kubernetes

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// fakeAPI is an httptest API server that serves one Pod ("p" in "ns") and
// deletes, on an address that refuses connections until up is called.
type fakeAPI struct {
	addr     string
	srv      *httptest.Server
	failures atomic.Int32 // answer 503 to this many requests first
	// loseCreates stores this many created Pods but answers 504, as when
	// the answer is lost.
	loseCreates atomic.Int32
	mu          sync.Mutex
	requests    []string
	created     map[string]bool
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeAPI{addr: ln.Addr().String()}
	require.NoError(t, ln.Close()) // refused until up
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.srv != nil {
			f.srv.Close()
		}
	})
	return f
}

// up starts serving on the reserved address.
func (f *fakeAPI) up(t *testing.T) {
	ln, err := net.Listen("tcp", f.addr)
	if !assert.NoError(t, err) {
		return
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	f.mu.Lock()
	f.srv = srv
	f.mu.Unlock()
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if f.failures.Add(-1) >= 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable})
		return
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/ns/pods":
		var pod corev1.Pod
		if err := json.NewDecoder(r.Body).Decode(&pod); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		exists := f.created[pod.Name]
		if f.created == nil {
			f.created = map[string]bool{}
		}
		f.created[pod.Name] = true
		f.mu.Unlock()
		switch {
		case exists:
			w.WriteHeader(http.StatusConflict)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Code: http.StatusConflict, Reason: metav1.StatusReasonAlreadyExists})
		case f.loseCreates.Add(-1) >= 0:
			w.WriteHeader(http.StatusGatewayTimeout)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Code: http.StatusGatewayTimeout, Reason: metav1.StatusReasonTimeout})
		default:
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(pod)
		}
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/ns/pods/p":
		_ = json.NewEncoder(w).Encode(corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}})
	case r.Method == http.MethodDelete:
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess})
	default:
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound})
	}
}

func (f *fakeAPI) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// backendFor is a Backend talking to f with the given outage bound.
func backendFor(t *testing.T, f *fakeAPI, outage time.Duration) *Backend {
	t.Helper()
	cfg := &rest.Config{Host: "http://" + f.addr}
	c, err := newClient(cfg)
	require.NoError(t, err)
	return &Backend{client: c, config: cfg, namespace: "ns", log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		apiOutage: outage, now: time.Now, live: map[string]*handle{}}
}

func TestPodReadRidesOutARefusingAPIServer(t *testing.T) {
	f := newFakeAPI(t)
	b := backendFor(t, f, 20*time.Second)
	const outage = 1500 * time.Millisecond
	time.AfterFunc(outage, func() { f.up(t) })
	start := time.Now()
	pod, err := b.getPod(t.Context(), "p")
	require.NoError(t, err)
	assert.Equal(t, corev1.PodRunning, pod.Status.Phase)
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, outage, "the read waited for the server")
	assert.Less(t, took, outage+6*time.Second, "the backoff is bounded (5s at most between attempts)")
}

func TestPodReadGivesUpPastTheOutageBound(t *testing.T) {
	f := newFakeAPI(t) // never up
	b := backendFor(t, f, time.Second)
	start := time.Now()
	_, err := b.getPod(t.Context(), "p")
	took := time.Since(start)
	require.ErrorIs(t, err, ErrAPIServerUnreachable)
	assert.Contains(t, err.Error(), f.addr, "the error names the API server")
	assert.Contains(t, err.Error(), "check that kube-apiserver is running", "the error names the fix")
	assert.GreaterOrEqual(t, took, time.Second)
	assert.Less(t, took, 3*time.Second)
}

func TestPodReadRetriesUnavailableAnswers(t *testing.T) {
	f := newFakeAPI(t)
	f.failures.Store(3)
	f.up(t)
	b := backendFor(t, f, 20*time.Second)
	_, err := b.getPod(t.Context(), "p")
	require.NoError(t, err)
	assert.Len(t, f.seen(), 4, "three 503s, then the answer")
}

func TestAnswersAboutTheRequestAreNotRetried(t *testing.T) {
	f := newFakeAPI(t)
	f.up(t)
	b := backendFor(t, f, 20*time.Second)
	_, err := b.getPod(t.Context(), "missing")
	require.True(t, apierrors.IsNotFound(err), "%v", err)
	assert.NotErrorIs(t, err, ErrAPIServerUnreachable)
	assert.Len(t, f.seen(), 1)
}

func TestDeleteWaitsForTheAPIServerToComeBack(t *testing.T) {
	f := newFakeAPI(t)
	b := backendFor(t, f, 20*time.Second)
	time.AfterFunc(time.Second, func() { f.up(t) })
	require.NoError(t, b.deleteRun(t.Context(), "p"))
	assert.Equal(t, []string{
		"DELETE /api/v1/namespaces/ns/pods/p",
		"DELETE /apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/p",
	}, f.seen())
}

func TestDeleteLeavesThePodForTheReaperPastTheBound(t *testing.T) {
	f := newFakeAPI(t) // never up
	b := backendFor(t, f, 500*time.Millisecond)
	err := b.deleteRun(t.Context(), "p")
	require.ErrorIs(t, err, ErrAPIServerUnreachable)
	assert.Contains(t, err.Error(), "delete pod p")
}

// createPod creates Pod name through the backend's retried create.
func createPod(t *testing.T, b *Backend, name string) error {
	t.Helper()
	return b.createRetried(t.Context(), "create pod "+name, func(ctx context.Context) error {
		_, err := b.client.pods("ns").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}})
		return err
	})
}

func TestCreateWaitsForARefusingAPIServer(t *testing.T) {
	f := newFakeAPI(t)
	b := backendFor(t, f, 20*time.Second)
	time.AfterFunc(time.Second, func() { f.up(t) })
	require.NoError(t, createPod(t, b, "p1"))
	assert.Equal(t, []string{"POST /api/v1/namespaces/ns/pods"}, f.seen())
}

func TestCreateWhoseAnswerWasLostSucceeds(t *testing.T) {
	f := newFakeAPI(t)
	f.loseCreates.Store(1)
	f.up(t)
	b := backendFor(t, f, 20*time.Second)
	require.NoError(t, createPod(t, b, "p1"), "the first attempt created it; the second is told it exists")
	assert.Len(t, f.seen(), 2)
}

func TestCreateOfAnExistingNameFails(t *testing.T) {
	f := newFakeAPI(t)
	f.up(t)
	b := backendFor(t, f, 20*time.Second)
	require.NoError(t, createPod(t, b, "p1"))
	err := createPod(t, b, "p1")
	require.True(t, apierrors.IsAlreadyExists(err), "%v", err)
}
