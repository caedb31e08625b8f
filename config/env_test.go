package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostEnv is a fixed caller environment.
func hostEnv(name string) (string, bool) {
	v, ok := map[string]string{"FROM_HOST": "host value", "EMPTY_ON_HOST": ""}[name]
	return v, ok
}

func TestParseEnvFileLikeDocker(t *testing.T) {
	file := "\xef\xbb\xbf# a comment\n" +
		"\n" +
		"PLAIN=value\n" +
		"   INDENTED=kept as is  \n" +
		"QUOTED=\"not unquoted\"\n" +
		"EQUALS=a=b=c\n" +
		"EMPTY=\r\n" +
		"FROM_HOST\n" +
		"EMPTY_ON_HOST\n" +
		"NOT_ON_HOST\n" +
		"  # indented comment\n"
	env, err := ParseEnvFile(strings.NewReader(file), hostEnv)
	require.NoError(t, err)
	assert.Equal(t, []string{
		"PLAIN=value", "INDENTED=kept as is  ", `QUOTED="not unquoted"`, "EQUALS=a=b=c", "EMPTY=",
		"FROM_HOST=host value", "EMPTY_ON_HOST=",
	}, env)
}

func TestParseEnvFileRefusesBadLines(t *testing.T) {
	for file, want := range map[string]string{
		"OK=1\nBAD NAME=x\n": "line 2",
		"=value\n":           "no variable name",
		"OK=\xff\xfe\n":      "line 1 is not valid UTF-8",
	} {
		_, err := ParseEnvFile(strings.NewReader(file), hostEnv)
		require.ErrorIs(t, err, ErrBadEnv, file)
		assert.Contains(t, err.Error(), want, file)
	}
}

func TestParseEnvVar(t *testing.T) {
	kv, ok, err := ParseEnvVar("A=1=2", hostEnv)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, "A=1=2", kv)
	kv, ok, err = ParseEnvVar("FROM_HOST", hostEnv)
	require.NoError(t, err)
	assert.Equal(t, "FROM_HOST=host value", kv)
	assert.True(t, ok)
	_, ok, err = ParseEnvVar("NOT_ON_HOST", hostEnv)
	require.NoError(t, err)
	assert.False(t, ok, "a bare name missing on the host is left out, as docker does")
	_, _, err = ParseEnvVar("", hostEnv)
	require.ErrorIs(t, err, ErrBadEnv)
}

func TestCheckEnvRefusesNamesTaskrunSets(t *testing.T) {
	require.NoError(t, CheckEnv([]string{"GOFLAGS=-mod=mod", "OPENAI_BASE_URL=http://127.0.0.1:9000/v1", "EMPTY="}))
	for _, kv := range []string{
		"TASKRUN_RUN_ID=forged", "TASKRUN_MODEL_SOCKET=/tmp/x", "HOME=/root",
		"HTTP_PROXY=http://evil", "https_proxy=http://evil", "No_Proxy=*", "all_proxy=socks5://x",
	} {
		err := CheckEnv([]string{"OK=1", kv})
		require.ErrorIs(t, err, ErrBadEnv, kv)
		assert.Contains(t, err.Error(), "is set by taskrun", kv)
	}
	for _, env := range [][]string{{"NOEQUALS"}, {"A=1", "A=2"}, {"BAD NAME=1"}, {"A=x\x00y"}} {
		require.ErrorIs(t, CheckEnv(env), ErrBadEnv, env)
	}
}
