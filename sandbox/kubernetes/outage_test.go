package kubernetes

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
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
		"DELETE /apis/coordination.k8s.io/v1/namespaces/ns/leases/p",
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

func TestUnansweredClassifiesByType(t *testing.T) {
	gr := corev1.Resource("pods")
	refused := &url.Error{Op: "Get", URL: "https://127.0.0.1:1", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
	reset := &url.Error{Op: "Get", URL: "https://127.0.0.1:1", Err: &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection refused", refused, true},
		{"connection reset", reset, true},
		{"attempt timed out", &url.Error{Op: "Get", URL: "https://x", Err: context.DeadlineExceeded}, true},
		{"lost response", &url.Error{Op: "Get", URL: "https://x", Err: io.ErrUnexpectedEOF}, true},
		{"429", apierrors.NewTooManyRequests("slow down", 1), true},
		{"500", apierrors.NewInternalError(io.EOF), true},
		{"502", apierrors.NewGenericServerResponse(http.StatusBadGateway, "get", gr, "p", "", 0, false), true},
		{"503", apierrors.NewServiceUnavailable("starting"), true},
		{"504", apierrors.NewTimeoutError("etcd", 1), true},
		{"server timeout", apierrors.NewServerTimeout(gr, "get", 1), true},
		{"not found", apierrors.NewNotFound(gr, "p"), false},
		{"forbidden", apierrors.NewForbidden(gr, "p", io.EOF), false},
		{"conflict", apierrors.NewAlreadyExists(gr, "p"), false},
		{"invalid", apierrors.NewBadRequest("no"), false},
		{"unauthorized", apierrors.NewUnauthorized("who"), false},
		{"unknown certificate authority", &url.Error{Op: "Get", URL: "https://x", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}}, false},
		{"certificate for another name", &url.Error{Op: "Get", URL: "https://x", Err: x509.HostnameError{Host: "x"}}, false},
		{"not TLS", &url.Error{Op: "Get", URL: "https://x", Err: tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, unanswered(tc.err), "%v", tc.err)
		})
	}
}

func TestRetriesEachTransientAnswerThenSucceeds(t *testing.T) {
	codes := []int{http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout}
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if i := int(n.Add(1)) - 1; i < len(codes) {
			w.WriteHeader(codes[i])
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Code: int32(codes[i])})
			return
		}
		_ = json.NewEncoder(w).Encode(corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}})
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL}
	c, err := newClient(cfg)
	require.NoError(t, err)
	b := &Backend{client: c, config: cfg, namespace: "ns", log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		apiOutage: time.Minute, now: time.Now, live: map[string]*handle{}}
	pod, err := b.getPod(t.Context(), "p")
	require.NoError(t, err)
	assert.Equal(t, "p", pod.Name)
	assert.Equal(t, int32(len(codes)+1), n.Load(), "one attempt per failure, then the answer")
}

func TestAnUntrustedServerIsNotRetried(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1) }))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL} // the kubeconfig does not trust the server's CA
	c, err := newClient(cfg)
	require.NoError(t, err)
	b := &Backend{client: c, config: cfg, namespace: "ns", log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		apiOutage: time.Hour, now: time.Now, live: map[string]*handle{}}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = b.getPod(ctx, "p")
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrAPIServerUnreachable, "a certificate that does not verify is an answer no retry changes")
	var verify *tls.CertificateVerificationError
	assert.ErrorAs(t, err, &verify)
	assert.Zero(t, n.Load(), "no request reached the untrusted server")
}
