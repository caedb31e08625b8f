package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The namespace's template: a ConfigMap the platform admin owns, with this
// name and label, in the runs' namespace.
const (
	// TemplateName is the name of the template's ConfigMap.
	TemplateName = "taskrun-template"
	// LabelTemplate must be "true" on the template's ConfigMap: a ConfigMap
	// that only happens to have its name is refused, not ignored.
	LabelTemplate = "dev.taskrun.template"
)

// Keys of the template's ConfigMap data. Each is optional: an absent key
// leaves that limit to the executor.
const (
	TemplateKeyRuntimeClass = "runtimeClass" // RuntimeClass every run Pod gets
	TemplateKeyMemory       = "memory"       // quantity, e.g. 512Mi
	TemplateKeyCPU          = "cpu"          // quantity, e.g. 500m
	TemplateKeyPids         = "pids"         // integer
	TemplateKeyDisk         = "disk"         // quantity, e.g. 256Mi
	TemplateKeyTimeout      = "timeout"      // Go duration, e.g. 10m
	TemplateKeyEgress       = "egress"       // "none" or "proxy"
)

// Egress allowances a template may give.
const (
	// EgressNone refuses runs with an egress policy: their Pods reach nothing.
	EgressNone = "none"
	// EgressProxy allows runs whose egress goes through taskrun's egress
	// proxy under their own egress policy.
	EgressProxy = "proxy"
)

// ErrTemplateExceeded is wrapped by the error of a run that asks more than
// its namespace's template allows.
var ErrTemplateExceeded = errors.New("run exceeds the namespace's template")

// ErrBadTemplate is wrapped by the error of a template that cannot be read
// as one.
var ErrBadTemplate = errors.New("invalid taskrun template")

// Template is what the platform admin fixes for every run in a namespace.
// A zero field fixes nothing.
type Template struct {
	// Source names the template in errors: namespace/name.
	Source       string
	RuntimeClass string
	MemoryBytes  int64
	MilliCPUs    int64
	PidsLimit    int64
	DiskBytes    int64
	Timeout      time.Duration
	// Egress is "", EgressNone or EgressProxy.
	Egress string
}

// Request is what the executor asks for one run. A zero DiskBytes takes
// the template's disk cap (else the backend's default); a zero Timeout
// asks for no timeout; a zero MemoryBytes, MilliCPUs or PidsLimit asks for
// no limit.
type Request struct {
	RuntimeClass string
	MemoryBytes  int64
	MilliCPUs    int64
	PidsLimit    int64
	DiskBytes    int64
	Timeout      time.Duration
	// Egress is true when the run has an egress policy.
	Egress bool
}

// TemplateError is a run asking more than its template allows.
type TemplateError struct {
	Template string // namespace/name
	Limit    string // memory, cpu, pids, disk, timeout, runtimeClass, egress
	Asked    string
	Allowed  string
	Flag     string // the executor's flag that asks it; "" for egress
}

// Error names the template, the limit, both values and the fix.
func (e *TemplateError) Error() string {
	fix := "run without an egress policy"
	if e.Flag != "" {
		fix = "pass " + e.Flag + " within it"
	}
	return fmt.Sprintf("%s: %s %s asked, template %s allows %s; %s, or have the platform admin change ConfigMap %s",
		ErrTemplateExceeded, e.Limit, e.Asked, e.Template, e.Allowed, fix, e.Template)
}

// Unwrap makes errors.Is(err, ErrTemplateExceeded) hold.
func (e *TemplateError) Unwrap() error { return ErrTemplateExceeded }

// MergeTemplate applies t to r: the executor may only tighten the
// template. An ask above a template limit (or none where the template has
// one) is refused with a *TemplateError, never clamped; an ask below it is
// kept. The template's RuntimeClass is fixed: a run asking for no class
// gets it, one asking for another is refused. A nil t returns r.
func MergeTemplate(t *Template, r Request) (Request, error) {
	if t == nil {
		return r, nil
	}
	exceeded := func(limit, asked, allowed, flag string) error {
		return &TemplateError{Template: t.Source, Limit: limit, Asked: asked, Allowed: allowed, Flag: flag}
	}
	qty := func(n int64, f resource.Format) string {
		if n == 0 {
			return "no limit"
		}
		return resource.NewQuantity(n, f).String()
	}
	if t.RuntimeClass != "" {
		switch r.RuntimeClass {
		case "":
			r.RuntimeClass = t.RuntimeClass
		case t.RuntimeClass:
		default:
			return r, exceeded("runtimeClass", strconv.Quote(r.RuntimeClass), strconv.Quote(t.RuntimeClass), "--runtime-class")
		}
	}
	if t.MemoryBytes > 0 && (r.MemoryBytes == 0 || r.MemoryBytes > t.MemoryBytes) {
		return r, exceeded("memory", qty(r.MemoryBytes, resource.BinarySI), qty(t.MemoryBytes, resource.BinarySI), "--memory")
	}
	if t.MilliCPUs > 0 && (r.MilliCPUs == 0 || r.MilliCPUs > t.MilliCPUs) {
		asked := "no limit"
		if r.MilliCPUs > 0 {
			asked = resource.NewMilliQuantity(r.MilliCPUs, resource.DecimalSI).String()
		}
		return r, exceeded("cpu", asked, resource.NewMilliQuantity(t.MilliCPUs, resource.DecimalSI).String(), "--cpus")
	}
	if t.PidsLimit > 0 && (r.PidsLimit == 0 || r.PidsLimit > t.PidsLimit) {
		return r, exceeded("pids", qty(r.PidsLimit, resource.DecimalSI), qty(t.PidsLimit, resource.DecimalSI), "--pids")
	}
	if t.DiskBytes > 0 {
		switch {
		case r.DiskBytes == 0:
			r.DiskBytes = t.DiskBytes
		case r.DiskBytes > t.DiskBytes:
			return r, exceeded("disk", qty(r.DiskBytes, resource.BinarySI), qty(t.DiskBytes, resource.BinarySI), "--disk")
		}
	}
	if t.Timeout > 0 && (r.Timeout <= 0 || r.Timeout > t.Timeout) {
		asked := "no timeout"
		if r.Timeout > 0 {
			asked = r.Timeout.String()
		}
		return r, exceeded("timeout", asked, t.Timeout.String(), "--timeout")
	}
	if t.Egress == EgressNone && r.Egress {
		return r, exceeded("egress", "an egress policy", "none", "")
	}
	return r, nil
}

// ParseTemplate reads a template from its ConfigMap: the label must be
// set, every key known and every value valid.
func ParseTemplate(cm *corev1.ConfigMap) (*Template, error) {
	src := cm.Namespace + "/" + cm.Name
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: ConfigMap %s: %s", ErrBadTemplate, src, fmt.Sprintf(format, a...))
	}
	if cm.Labels[LabelTemplate] != "true" {
		return nil, bad("label %s=true is missing; label it if it is taskrun's template, or rename it", LabelTemplate)
	}
	t := &Template{Source: src}
	keys := make([]string, 0, len(cm.Data))
	for k := range cm.Data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := strings.TrimSpace(cm.Data[k])
		var err error
		switch k {
		case TemplateKeyRuntimeClass:
			t.RuntimeClass = v
		case TemplateKeyMemory:
			t.MemoryBytes, err = positiveQuantity(v, false)
		case TemplateKeyCPU:
			t.MilliCPUs, err = positiveQuantity(v, true)
		case TemplateKeyDisk:
			t.DiskBytes, err = positiveQuantity(v, false)
		case TemplateKeyPids:
			t.PidsLimit, err = strconv.ParseInt(v, 10, 64)
			if err == nil && t.PidsLimit <= 0 {
				err = errors.New("must be positive")
			}
		case TemplateKeyTimeout:
			t.Timeout, err = time.ParseDuration(v)
			if err == nil && t.Timeout <= 0 {
				err = errors.New("must be positive")
			}
		case TemplateKeyEgress:
			if v != EgressNone && v != EgressProxy {
				err = fmt.Errorf("give %q or %q", EgressNone, EgressProxy)
			}
			t.Egress = v
		default:
			return nil, bad("unknown key %q (known: %s)", k, strings.Join([]string{TemplateKeyRuntimeClass, TemplateKeyMemory,
				TemplateKeyCPU, TemplateKeyPids, TemplateKeyDisk, TemplateKeyTimeout, TemplateKeyEgress}, ", "))
		}
		if err != nil {
			return nil, bad("%s %q: %v", k, v, err)
		}
	}
	return t, nil
}

// positiveQuantity parses a Kubernetes quantity: its value, or its
// milli-value when milli.
func positiveQuantity(s string, milli bool) (int64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, err
	}
	n := q.Value()
	if milli {
		n = q.MilliValue()
	}
	if n <= 0 {
		return 0, errors.New("must be positive")
	}
	return n, nil
}

// template reads the namespace's template: nil when there is none. An
// executor that may not read it is refused: it could not honour it.
func (b *Backend) template(ctx context.Context) (*Template, error) {
	var cm *corev1.ConfigMap
	err := b.retryAPI(ctx, "get configmap "+TemplateName, func(ctx context.Context) error {
		var err error
		cm, err = b.client.configMaps(b.namespace).Get(ctx, TemplateName)
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case apierrors.IsForbidden(err):
		return nil, fmt.Errorf("read the template ConfigMap %s/%s: %w; grant the executor get on configmaps named %s in the namespace (and nothing more on configmaps)",
			b.namespace, TemplateName, err, TemplateName)
	case err != nil:
		return nil, fmt.Errorf("read the template ConfigMap %s/%s: %w", b.namespace, TemplateName, err)
	}
	return ParseTemplate(cm)
}
