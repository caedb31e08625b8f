package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// client is the backend's narrow API client: Pods, NetworkPolicies,
// Leases and Namespaces, the server version, and the URLs of attach and exec. It
// stands in for client-go's clientset, whose packages register every API
// group of Kubernetes in a scheme at package init: every taskrun command,
// not only those that reach a cluster, paid for that at start.
type client struct {
	core       *rest.RESTClient // /api/v1
	networking *rest.RESTClient // /apis/networking.k8s.io/v1
	coord      *rest.RESTClient // /apis/coordination.k8s.io/v1
	params     runtime.ParameterCodec
}

// apiTypes is the scheme of the types the client sends and receives, built
// on first use rather than at package init.
var apiTypes = sync.OnceValues(func() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	// Each group's AddToScheme also registers Status (the API server's
	// errors) and the option types in its version.
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, networkingv1.AddToScheme, coordinationv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
})

// newClient makes the client for cfg. Its REST clients share one HTTP
// client and one rate limiter, as a clientset's do.
func newClient(cfg *rest.Config) (*client, error) {
	s, err := apiTypes()
	if err != nil {
		return nil, fmt.Errorf("kubernetes API types: %w", err)
	}
	c := rest.CopyConfig(cfg)
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if c.RateLimiter == nil && c.QPS >= 0 {
		qps, burst := c.QPS, c.Burst
		if qps == 0 {
			qps = rest.DefaultQPS
		}
		if burst <= 0 {
			burst = rest.DefaultBurst
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	}
	httpClient, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, err
	}
	codecs := serializer.NewCodecFactory(s)
	restFor := func(apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
		gc := rest.CopyConfig(c)
		gc.APIPath = apiPath
		gc.GroupVersion = &gv
		gc.NegotiatedSerializer = codecs.WithoutConversion()
		return rest.RESTClientForConfigAndClient(gc, httpClient)
	}
	core, err := restFor("/api", corev1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	networking, err := restFor("/apis", networkingv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	coord, err := restFor("/apis", coordinationv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return &client{core: core, networking: networking, coord: coord, params: runtime.NewParameterCodec(s)}, nil
}

// pods is the Pods of namespace ns.
func (c *client) pods(ns string) objects[*corev1.Pod, *corev1.PodList] {
	return objects[*corev1.Pod, *corev1.PodList]{c.core, ns, "pods",
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} }}
}

// networkPolicies is the NetworkPolicies of namespace ns.
func (c *client) networkPolicies(ns string) objects[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList] {
	return objects[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList]{c.networking, ns, "networkpolicies",
		func() *networkingv1.NetworkPolicy { return &networkingv1.NetworkPolicy{} },
		func() *networkingv1.NetworkPolicyList { return &networkingv1.NetworkPolicyList{} }}
}

// leases is the Leases of namespace ns.
func (c *client) leases(ns string) objects[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return objects[*coordinationv1.Lease, *coordinationv1.LeaseList]{c.coord, ns, "leases",
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} }, func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} }}
}

// namespaces is the cluster's Namespaces.
func (c *client) namespaces() objects[*corev1.Namespace, *corev1.NamespaceList] {
	return objects[*corev1.Namespace, *corev1.NamespaceList]{c.core, "", "namespaces",
		func() *corev1.Namespace { return &corev1.Namespace{} }, func() *corev1.NamespaceList { return &corev1.NamespaceList{} }}
}

// serverVersion is the API server's version.
func (c *client) serverVersion(ctx context.Context) (*version.Info, error) {
	raw, err := c.core.Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	var v version.Info
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("decode the server version: %w", err)
	}
	return &v, nil
}

// streamURL is the URL of a Pod's attach or exec subresource (sub) with
// opts (a PodAttachOptions or PodExecOptions) as its parameters.
func (c *client) streamURL(ns, pod, sub string, opts runtime.Object) *url.URL {
	return c.core.Post().Namespace(ns).Resource("pods").Name(pod).SubResource(sub).
		VersionedParams(opts, c.params).URL()
}

// objects is one resource of one API group, in a namespace or (ns "")
// cluster-wide: the calls the backend makes on it.
type objects[T, L runtime.Object] struct {
	rc       *rest.RESTClient
	ns       string
	resource string
	newObj   func() T
	newList  func() L
}

func (o objects[T, L]) req(r *rest.Request) *rest.Request {
	return r.NamespaceIfScoped(o.ns, o.ns != "").Resource(o.resource)
}

// Get reads the named object.
func (o objects[T, L]) Get(ctx context.Context, name string) (T, error) {
	out := o.newObj()
	err := o.req(o.rc.Get()).Name(name).Do(ctx).Into(out)
	return out, err
}

// List reads the objects matching the label selector ("" for all).
func (o objects[T, L]) List(ctx context.Context, selector string) (L, error) {
	out := o.newList()
	r := o.req(o.rc.Get())
	if selector != "" {
		r = r.Param("labelSelector", selector)
	}
	err := r.Do(ctx).Into(out)
	return out, err
}

// Create creates obj and returns what the API server stored.
func (o objects[T, L]) Create(ctx context.Context, obj T) (T, error) {
	out := o.newObj()
	err := o.req(o.rc.Post()).Body(obj).Do(ctx).Into(out)
	return out, err
}

// MergePatch applies a JSON merge patch to the named object and returns
// what the API server stored.
func (o objects[T, L]) MergePatch(ctx context.Context, name string, patch []byte) (T, error) {
	out := o.newObj()
	err := o.req(o.rc.Patch(types.MergePatchType)).Name(name).Body(patch).Do(ctx).Into(out)
	return out, err
}

// Delete deletes the named object.
func (o objects[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return o.req(o.rc.Delete()).Name(name).Body(&opts).Do(ctx).Error()
}

// configMaps is the ConfigMaps of namespace ns.
func (c *client) configMaps(ns string) objects[*corev1.ConfigMap, *corev1.ConfigMapList] {
	return objects[*corev1.ConfigMap, *corev1.ConfigMapList]{c.core, ns, "configmaps",
		func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, func() *corev1.ConfigMapList { return &corev1.ConfigMapList{} }}
}
