package kubernetes

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// apiRequest is one request the test API server received.
type apiRequest struct {
	method, path, query string
	body                map[string]any
}

// TestClientSpeaksTheAPI drives the narrow client against an HTTP server
// answering as the API server does, and checks the paths, parameters and
// bodies it sends and that it decodes objects, lists and Status errors.
func TestClientSpeaksTheAPI(t *testing.T) {
	var (
		mu   sync.Mutex
		reqs []apiRequest
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		if len(raw) > 0 {
			assert.NoError(t, json.Unmarshal(raw, &body), "request body %s", raw)
		}
		mu.Lock()
		reqs = append(reqs, apiRequest{r.Method, r.URL.Path, r.URL.RawQuery, body})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.Method + " " + r.URL.Path {
		case "GET /api/v1/namespaces/ns/pods/p1":
			_, _ = w.Write([]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p1","namespace":"ns"},"status":{"phase":"Running"}}`))
		case "GET /api/v1/namespaces/ns/pods":
			_, _ = w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}`))
		case "POST /apis/networking.k8s.io/v1/namespaces/ns/networkpolicies":
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(raw)
		case "DELETE /api/v1/namespaces/ns/pods/p1":
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Success"}`))
		case "GET /api/v1/namespaces/ns":
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"namespaces \"ns\" is forbidden"}`))
		case "GET /version":
			_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"not found"}`))
		}
	}))
	t.Cleanup(srv.Close)

	c, err := newClient(&rest.Config{Host: srv.URL})
	require.NoError(t, err)
	ctx := t.Context()

	pod, err := c.pods("ns").Get(ctx, "p1")
	require.NoError(t, err)
	assert.Equal(t, "p1", pod.Name)
	assert.Equal(t, corev1.PodRunning, pod.Status.Phase)

	_, err = c.pods("ns").Get(ctx, "gone")
	assert.True(t, apierrors.IsNotFound(err), "a 404 Status should be NotFound: %v", err)

	list, err := c.pods("ns").List(ctx, "dev.taskrun.managed=true")
	require.NoError(t, err)
	require.Len(t, list.Items, 2)
	assert.Equal(t, "b", list.Items[1].Name)

	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "np1", Namespace: "ns"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}}
	created, err := c.networkPolicies("ns").Create(ctx, np)
	require.NoError(t, err)
	assert.Equal(t, "np1", created.Name)
	assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}, created.Spec.PolicyTypes)

	zero := int64(0)
	require.NoError(t, c.pods("ns").Delete(ctx, "p1", metav1.DeleteOptions{GracePeriodSeconds: &zero}))

	_, err = c.namespaces().Get(ctx, "ns")
	assert.True(t, apierrors.IsForbidden(err), "a 403 Status should be Forbidden: %v", err)

	v, err := c.serverVersion(ctx)
	require.NoError(t, err)
	assert.Equal(t, "v1.37.2", v.GitVersion)

	u := c.streamURL("ns", "p1", "exec", &corev1.PodExecOptions{Container: "run", Command: []string{"ls", "-l"}, Stdout: true})
	assert.Equal(t, "/api/v1/namespaces/ns/pods/p1/exec", u.Path)
	assert.Equal(t, []string{"ls", "-l"}, u.Query()["command"])
	assert.Equal(t, "run", u.Query().Get("container"))
	assert.Equal(t, "true", u.Query().Get("stdout"))

	mu.Lock()
	defer mu.Unlock()
	byPath := map[string]apiRequest{}
	for _, r := range reqs {
		byPath[r.method+" "+r.path] = r
	}
	assert.Equal(t, "labelSelector=dev.taskrun.managed%3Dtrue", byPath["GET /api/v1/namespaces/ns/pods"].query)
	post := byPath["POST /apis/networking.k8s.io/v1/namespaces/ns/networkpolicies"].body
	assert.Equal(t, "NetworkPolicy", post["kind"])
	assert.Equal(t, "networking.k8s.io/v1", post["apiVersion"])
	del := byPath["DELETE /api/v1/namespaces/ns/pods/p1"].body
	assert.Equal(t, "DeleteOptions", del["kind"])
	assert.EqualValues(t, 0, del["gracePeriodSeconds"])
}
