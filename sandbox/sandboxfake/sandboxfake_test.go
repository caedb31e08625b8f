package sandboxfake_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

func start(t *testing.T, b *sandboxfake.Backend, spec sandbox.Spec) sandbox.Handle {
	t.Helper()
	if spec.Image == "" {
		spec.Image = "img"
	}
	h, err := b.Start(t.Context(), spec, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.Close(context.Background())) })
	return h
}

func TestOOMKillAndTimeOutAreReported(t *testing.T) {
	b := sandboxfake.New(sandboxfake.WithMaxStopGrace(time.Millisecond))
	b.Install("oom", func(_ context.Context, p *sandboxfake.Process) int { return p.OOMKill() })
	b.Install("expire", func(ctx context.Context, p *sandboxfake.Process) int { p.TimeOut(); <-ctx.Done(); return 0 })

	res := start(t, b, sandbox.Spec{Cmd: []string{"oom"}}).Wait(t.Context())
	assert.True(t, res.OOMKilled)
	assert.Equal(t, sandboxfake.KilledExitCode, res.ExitCode)
	assert.False(t, res.Succeeded())

	res = start(t, b, sandbox.Spec{Cmd: []string{"expire"}}).Wait(t.Context())
	assert.True(t, res.TimedOut)
	assert.Equal(t, sandboxfake.KilledExitCode, res.ExitCode, "ignored SIGTERM, killed after the grace")
}

func TestStartRefusesWhatAnEngineRefuses(t *testing.T) {
	b := sandboxfake.New(sandboxfake.WithImages("known"))
	_, err := b.Start(t.Context(), sandbox.Spec{Image: "unknown"}, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.ErrorIs(t, err, sandbox.ErrImageNotFound)

	_, err = b.Start(t.Context(), sandbox.Spec{Image: "known", Cmd: []string{"nothing"}}, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.ErrorIs(t, err, sandboxfake.ErrNoProgram)

	b.Install("ok", func(context.Context, *sandboxfake.Process) int { return 0 })
	missing := sandbox.Spec{Image: "known", Cmd: []string{"ok"}, Mounts: []sandbox.Mount{{Source: filepath.Join(t.TempDir(), "nope"), Target: "/x"}}}
	_, err = b.Start(t.Context(), missing, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.ErrorIs(t, err, os.ErrNotExist)

	root := sandbox.DefaultPolicy()
	root.User = "0"
	_, err = b.Start(t.Context(), sandbox.Spec{Image: "known", Cmd: []string{"ok"}}, root, sandbox.Streams{})
	require.Error(t, err)

	b.FailStarts(errors.New("boom"))
	_, err = b.Start(t.Context(), sandbox.Spec{Image: "known", Cmd: []string{"ok"}}, sandbox.DefaultPolicy(), sandbox.Streams{})
	require.ErrorIs(t, err, sandboxfake.ErrStart)
	assert.Empty(t, b.Started(), "no container was created")
}

// The posture is the policy applied: it passes every audit rule, carries
// the run's labels, and a tampered posture is caught by the audit.
func TestPostureIsThePolicy(t *testing.T) {
	dir := t.TempDir()
	spec := sandbox.Spec{Cmd: []string{"sleep"}, Run: model.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: filepath.Base(dir)},
		Mounts: []sandbox.Mount{{Source: dir, Target: model.ContainerRunDir}}}
	b := sandboxfake.New(sandboxfake.WithDefault(func(ctx context.Context, _ *sandboxfake.Process) int { <-ctx.Done(); return 137 }))
	h := start(t, b, spec)
	p, err := h.Posture(t.Context())
	require.NoError(t, err)
	assert.Equal(t, h.ID(), p.ID)
	assert.Equal(t, "u", p.Labels[sandbox.LabelTenant])
	rep := audit.Check(p, audit.HostFacts{Seccomp: true}, audit.Options{})
	assert.False(t, rep.Failed(), "failed: %v", rep.FailedIDs())

	loose := sandboxfake.New(sandboxfake.WithDefault(func(ctx context.Context, _ *sandboxfake.Process) int { <-ctx.Done(); return 137 }),
		sandboxfake.WithPosture(func(p *sandbox.Posture) { p.CapAdd = []string{"SYS_ADMIN"} }))
	p, err = start(t, loose, spec).Posture(t.Context())
	require.NoError(t, err)
	assert.Contains(t, audit.Check(p, audit.HostFacts{}, audit.Options{}).FailedIDs(), "5.4", "added capabilities fail CIS 5.4")

	require.NoError(t, h.Close(t.Context()))
	_, err = h.Posture(t.Context())
	require.ErrorIs(t, err, sandboxfake.ErrRemoved)
	assert.Empty(t, b.Containers(nil))
}

func TestHostPathPicksTheDeepestMount(t *testing.T) {
	outer, inner := t.TempDir(), t.TempDir()
	b := sandboxfake.New()
	got := make(chan []string, 1)
	b.Install("look", func(_ context.Context, p *sandboxfake.Process) int {
		a, _, _ := p.HostPath("/run/sub/file")
		c, ro, _ := p.HostPath("/run/other")
		_, _, ok := p.HostPath("/etc/passwd")
		got <- []string{a, c, map[bool]string{true: "ro"}[ro], map[bool]string{false: "unmapped"}[ok]}
		return 0
	})
	h := start(t, b, sandbox.Spec{Cmd: []string{"look"}, Mounts: []sandbox.Mount{
		{Source: outer, Target: "/run", ReadOnly: true}, {Source: inner, Target: "/run/sub"},
	}})
	h.Wait(t.Context())
	assert.Equal(t, []string{filepath.Join(inner, "file"), filepath.Join(outer, "other"), "ro", "unmapped"}, <-got)
}

func TestCreateRefusesARestore(t *testing.T) {
	b := sandboxfake.New()
	_, err := b.Create(t.Context(), sandbox.Spec{Image: "img", RestoreFrom: t.TempDir()}, sandbox.DefaultPolicy())
	require.ErrorIs(t, err, sandbox.ErrCheckpointUnsupported)
}
