package executor_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

const pinned = "registry.example.com/team/agent@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// An image outside the allow list is refused in plan: the backend is never
// asked to resolve (pull) it, nothing is created, and the refusal names the
// flag.
func TestImageOutsideAllowListIsRefusedBeforeAnyPull(t *testing.T) {
	for name, tc := range map[string]struct {
		image   string
		allowed []string
	}{
		"other repository":     {"registry.example.com/other/agent:v1", []string{"registry.example.com/team/*"}},
		"tag against a pin":    {"registry.example.com/team/agent:v1", []string{pinned}},
		"short name elsewhere": {"agent", []string{"registry.example.com/team/agent"}},
	} {
		t.Run(name, func(t *testing.T) {
			u := newUnit(t)
			in := u.input("r1", func(context.Context, *sandboxfake.Process) int { return 0 })
			in.Image, in.AllowedImages = tc.image, tc.allowed
			out, err := executor.Execute(context.Background(), in)
			require.ErrorIs(t, err, executor.ErrImageNotAllowed)
			assert.ErrorContains(t, err, "--allowed-images")
			assert.Equal(t, model.StatusFailed, out.Status)
			assert.Empty(t, u.b.Resolved(), "the image was resolved (pulled) before the allow list refused it")
			assert.Empty(t, u.b.Started())
			_, statErr := os.Stat(u.runDir("r1"))
			assert.True(t, os.IsNotExist(statErr), "a run dir was made: %v", statErr)
		})
	}
}

func TestBadPullPolicyOrPatternIsInvalidInput(t *testing.T) {
	u := newUnit(t)
	in := u.input("r1", nil)
	in.Pull = "sometimes"
	_, err := executor.Execute(context.Background(), in)
	require.ErrorIs(t, err, executor.ErrInvalidInput)
	in = u.input("r2", nil)
	in.AllowedImages = []string{"Bad/Name"}
	_, err = executor.Execute(context.Background(), in)
	require.ErrorIs(t, err, executor.ErrInvalidInput)
	assert.ErrorContains(t, err, "--allowed-images")
	assert.Empty(t, u.b.Resolved())
}

// An allowed, digest-pinned image is resolved with the run's pull policy and
// its digest is named in the outcome, the PATCH and the isolation record.
func TestRunRecordsTheImageDigest(t *testing.T) {
	u := newUnit(t)
	in := u.input("r1", func(context.Context, *sandboxfake.Process) int { return 0 })
	in.Image, in.AllowedImages, in.Pull = pinned, []string{"registry.example.com/team/agent@sha256:*"}, sandbox.PullAlways
	out, err := executor.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, []string{pinned}, u.b.Resolved())
	assert.Equal(t, pinned, out.ImageDigest)
	assert.Equal(t, pinned, out.Image)
	final := u.final(t)
	require.NotNil(t, final.Container)
	assert.Equal(t, pinned, final.Container.ImageDigest)
	var rec audit.Record
	require.NoError(t, json.Unmarshal([]byte(u.runFile(t, "r1", executor.AuditRecordName)), &rec))
	assert.Equal(t, pinned, rec.ImageDigest)
	assert.Equal(t, sandboxfake.ImageID(pinned), rec.Posture.Image)

	// A local image has no repo digest: its ID names it.
	in = u.input("r2", func(context.Context, *sandboxfake.Process) int { return 0 })
	out, err = executor.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, sandboxfake.ImageID(in.Image), out.ImageDigest)
}
