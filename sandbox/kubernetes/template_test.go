package kubernetes

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMergeTemplate(t *testing.T) {
	tpl := &Template{Source: "runs/taskrun-template", RuntimeClass: "gvisor", MemoryBytes: 512 << 20, MilliCPUs: 500,
		PidsLimit: 128, DiskBytes: 256 << 20, Timeout: 10 * time.Minute, Egress: EgressNone}
	within := Request{MemoryBytes: 256 << 20, MilliCPUs: 250, PidsLimit: 64, DiskBytes: 128 << 20, Timeout: time.Minute}
	with := func(edit func(*Request)) Request { r := within; edit(&r); return r }
	for _, tc := range []struct {
		name  string
		tpl   *Template
		req   Request
		want  Request
		limit string // the refused limit; "" when admitted
	}{
		{"no template keeps the request", nil, Request{MemoryBytes: 8 << 30, RuntimeClass: "x", Egress: true},
			Request{MemoryBytes: 8 << 30, RuntimeClass: "x", Egress: true}, ""},
		{"less than the template is honoured; the class is the template's", tpl, within,
			with(func(r *Request) { r.RuntimeClass = "gvisor" }), ""},
		{"exactly the template", tpl, Request{RuntimeClass: "gvisor", MemoryBytes: 512 << 20, MilliCPUs: 500, PidsLimit: 128, DiskBytes: 256 << 20, Timeout: 10 * time.Minute},
			Request{RuntimeClass: "gvisor", MemoryBytes: 512 << 20, MilliCPUs: 500, PidsLimit: 128, DiskBytes: 256 << 20, Timeout: 10 * time.Minute}, ""},
		{"no disk ask takes the template's", tpl, with(func(r *Request) { r.DiskBytes = 0 }),
			with(func(r *Request) { r.DiskBytes = 256 << 20; r.RuntimeClass = "gvisor" }), ""},
		{"another runtime class", tpl, with(func(r *Request) { r.RuntimeClass = "runc" }), Request{}, "runtimeClass"},
		{"more memory", tpl, with(func(r *Request) { r.MemoryBytes = 1 << 30 }), Request{}, "memory"},
		{"no memory limit", tpl, with(func(r *Request) { r.MemoryBytes = 0 }), Request{}, "memory"},
		{"more cpu", tpl, with(func(r *Request) { r.MilliCPUs = 501 }), Request{}, "cpu"},
		{"no cpu limit", tpl, with(func(r *Request) { r.MilliCPUs = 0 }), Request{}, "cpu"},
		{"more pids", tpl, with(func(r *Request) { r.PidsLimit = 129 }), Request{}, "pids"},
		{"more disk", tpl, with(func(r *Request) { r.DiskBytes = 257 << 20 }), Request{}, "disk"},
		{"longer timeout", tpl, with(func(r *Request) { r.Timeout = 11 * time.Minute }), Request{}, "timeout"},
		{"no timeout", tpl, with(func(r *Request) { r.Timeout = 0 }), Request{}, "timeout"},
		{"egress where the template allows none", tpl, with(func(r *Request) { r.Egress = true }), Request{}, "egress"},
		{"egress where the template allows the proxy", &Template{Egress: EgressProxy}, Request{Egress: true}, Request{Egress: true}, ""},
		{"an empty template fixes nothing", &Template{}, Request{Timeout: 0, MemoryBytes: 0, RuntimeClass: "kata"}, Request{RuntimeClass: "kata"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MergeTemplate(tc.tpl, tc.req)
			if tc.limit == "" {
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
				return
			}
			require.ErrorIs(t, err, ErrTemplateExceeded)
			var te *TemplateError
			require.True(t, errors.As(err, &te))
			assert.Equal(t, tc.limit, te.Limit)
			assert.Equal(t, "runs/taskrun-template", te.Template)
			assert.Contains(t, err.Error(), "runs/taskrun-template", "the error names the template")
		})
	}
}

func TestParseTemplate(t *testing.T) {
	cm := func(labelled bool, data map[string]string) *corev1.ConfigMap {
		c := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "runs", Name: TemplateName}, Data: data}
		if labelled {
			c.Labels = map[string]string{LabelTemplate: "true"}
		}
		return c
	}
	got, err := ParseTemplate(cm(true, map[string]string{"runtimeClass": "gvisor", "memory": "512Mi", "cpu": "500m",
		"pids": "128", "disk": "1Gi", "timeout": "10m", "egress": "none"}))
	require.NoError(t, err)
	assert.Equal(t, &Template{Source: "runs/" + TemplateName, RuntimeClass: "gvisor", MemoryBytes: 512 << 20, MilliCPUs: 500,
		PidsLimit: 128, DiskBytes: 1 << 30, Timeout: 10 * time.Minute, Egress: EgressNone}, got)

	got, err = ParseTemplate(cm(true, nil))
	require.NoError(t, err)
	assert.Equal(t, &Template{Source: "runs/" + TemplateName}, got, "an empty template fixes nothing")

	for name, c := range map[string]*corev1.ConfigMap{
		"no label":         cm(false, map[string]string{"memory": "1Gi"}),
		"unknown key":      cm(true, map[string]string{"memroy": "1Gi"}),
		"bad quantity":     cm(true, map[string]string{"memory": "lots"}),
		"zero memory":      cm(true, map[string]string{"memory": "0"}),
		"negative pids":    cm(true, map[string]string{"pids": "-1"}),
		"bad timeout":      cm(true, map[string]string{"timeout": "soon"}),
		"negative timeout": cm(true, map[string]string{"timeout": "-1m"}),
		"bad egress":       cm(true, map[string]string{"egress": "all"}),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseTemplate(c)
			require.ErrorIs(t, err, ErrBadTemplate)
			assert.Contains(t, err.Error(), "runs/"+TemplateName)
		})
	}
}
