package imageref

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func TestNormalizeLikeDocker(t *testing.T) {
	for in, want := range map[string]string{
		"ubuntu":                          "docker.io/library/ubuntu:latest",
		"docker.io/library/ubuntu:latest": "docker.io/library/ubuntu:latest",
		"me/agent:v1":                     "docker.io/me/agent:v1",
		"127.0.0.1:5000/team/agent":       "127.0.0.1:5000/team/agent:latest",
		"ubuntu@" + digestA:               "docker.io/library/ubuntu@" + digestA,
	} {
		got, err := Normalize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
}

func TestAllowlist(t *testing.T) {
	cases := []struct {
		patterns []string
		image    string
		allowed  bool
	}{
		// A short name and its fully qualified form are the same image.
		{[]string{"ubuntu"}, "docker.io/library/ubuntu:latest", true},
		{[]string{"docker.io/library/ubuntu:latest"}, "ubuntu", true},
		{[]string{"docker.io/library/ubuntu:latest"}, "ubuntu:22.04", false},
		{[]string{"ubuntu:*"}, "ubuntu:22.04", true},
		{[]string{"ubuntu"}, "ubuntu@" + digestA, true},
		{[]string{"ubuntu"}, "ubuntu-evil", false},
		{[]string{"ubuntu"}, "evil.example.com/library/ubuntu", false},
		// Name globs stay within one path element.
		{[]string{"registry.example.com/team/*"}, "registry.example.com/team/agent:v2", true},
		{[]string{"registry.example.com/team/*"}, "registry.example.com/team/sub/agent", false},
		{[]string{"registry.example.com/team/*"}, "registry.example.com/other/agent", false},
		{[]string{"127.0.0.1:5000/agent:v1.*"}, "127.0.0.1:5000/agent:v1.2", true},
		{[]string{"127.0.0.1:5000/agent:v1.*"}, "127.0.0.1:5000/agent:v2.0", false},
		// A digest pin cannot be bypassed by a tag, nor by another digest.
		{[]string{"127.0.0.1:5000/agent@" + digestA}, "127.0.0.1:5000/agent@" + digestA, true},
		{[]string{"127.0.0.1:5000/agent@" + digestA}, "127.0.0.1:5000/agent:v1@" + digestA, true},
		{[]string{"127.0.0.1:5000/agent@" + digestA}, "127.0.0.1:5000/agent:latest", false},
		{[]string{"127.0.0.1:5000/agent@" + digestA}, "127.0.0.1:5000/agent", false},
		{[]string{"127.0.0.1:5000/agent@" + digestA}, "127.0.0.1:5000/agent@" + digestB, false},
		{[]string{"127.0.0.1:5000/agent@sha256:*"}, "127.0.0.1:5000/agent@" + digestB, true},
		{[]string{"127.0.0.1:5000/agent@sha256:*"}, "127.0.0.1:5000/agent:v1", false},
		// A tag pattern does not cover a digest: the digest decides what runs.
		{[]string{"127.0.0.1:5000/agent:v1"}, "127.0.0.1:5000/agent:v1@" + digestB, false},
		// An image ID names no repository.
		{[]string{"ubuntu"}, strings.TrimPrefix(digestA, "sha256:"), false},
		// Any pattern of the list will do.
		{[]string{"ubuntu", "taskrun/agent:local"}, "taskrun/agent:local", true},
	}
	for _, c := range cases {
		a, err := ParseAllowlist(c.patterns)
		require.NoError(t, err, c.patterns)
		err = a.Check(c.image, "--allowed-images")
		if c.allowed {
			assert.NoError(t, err, "%s against %v", c.image, c.patterns)
			continue
		}
		require.ErrorIs(t, err, ErrNotAllowed, "%s against %v", c.image, c.patterns)
		assert.Contains(t, err.Error(), "--allowed-images")
	}
}

func TestEmptyAllowlistAllowsEverything(t *testing.T) {
	a, err := ParseAllowlist(nil)
	require.NoError(t, err)
	assert.True(t, a.Empty())
	assert.NoError(t, a.Check("anything/at:all", "--allowed-images"))
}

func TestParseAllowlistRefusesBadPatterns(t *testing.T) {
	for _, p := range []string{
		"", "Ubuntu", "ubuntu:", "ubuntu@sha256:abc", "ubuntu@md5:" + strings.Repeat("a", 32),
		"ubuntu:v1@" + digestA, "ubuntu:[", "team/Agent",
	} {
		_, err := ParseAllowlist([]string{"ok", p})
		require.ErrorIs(t, err, ErrBadPattern, "%q", p)
	}
}
