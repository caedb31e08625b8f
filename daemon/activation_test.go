package daemon

import (
	"os"

	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestActivationFDs(t *testing.T) {
	env := func(vars map[string]string) func(string) string {
		return func(k string) string { return vars[k] }
	}
	cases := []struct {
		name string
		vars map[string]string
		want []int
		err  bool
	}{
		{"no activation", nil, nil, false},
		{"one socket", map[string]string{EnvListenPID: "42", EnvListenFDs: "1"}, []int{3}, false},
		{"two sockets", map[string]string{EnvListenPID: "42", EnvListenFDs: "2"}, []int{3, 4}, false},
		// Inherited from a parent that was activated: not ours.
		{"another process's", map[string]string{EnvListenPID: "41", EnvListenFDs: "1"}, nil, false},
		{"bad pid", map[string]string{EnvListenPID: "x", EnvListenFDs: "1"}, nil, true},
		{"bad count", map[string]string{EnvListenPID: "42", EnvListenFDs: "-1"}, nil, true},
		{"no count", map[string]string{EnvListenPID: "42"}, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fds, err := activationFDs(env(c.vars), 42)
			if c.err {
				require.ErrorIs(t, err, ErrActivation)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, fds)
		})
	}
}

func TestNoActivationListenerWithoutTheVariables(t *testing.T) {
	t.Setenv(EnvListenPID, "1")
	t.Setenv(EnvListenFDs, "1")
	l, err := ActivationListener()
	require.NoError(t, err)
	assert.Nil(t, l, "the variables name another process: descriptor 3 is not ours")
	_, set := os.LookupEnv(EnvListenPID)
	assert.False(t, set, "the variables are unset, so no child inherits them")
}
