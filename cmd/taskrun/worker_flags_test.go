package main

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parseWorker parses `taskrun worker` flags (with a server and a token).
func parseWorker(t *testing.T, args ...string) (workerOptions, error) {
	t.Helper()
	t.Setenv(workerTokenEnv, "tok")
	var o workerOptions
	fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
	o.define(fs)
	require.NoError(t, fs.Parse(append([]string{"--server", "http://127.0.0.1:1"}, args...)))
	return o, o.finish()
}

// --warm is off by default, and a value the worker cannot honour is refused
// with the fix named.
func TestWorkerWarmFlagChecks(t *testing.T) {
	o, err := parseWorker(t)
	require.NoError(t, err)
	assert.Zero(t, o.warm, "no warm containers unless asked")

	o, err = parseWorker(t, "--warm", "2")
	require.NoError(t, err)
	assert.Equal(t, 2, o.warm)

	_, err = parseWorker(t, "--warm", "-1")
	assert.ErrorContains(t, err, "--warm -1")
	_, err = parseWorker(t, "--warm", "1", "--helpers-dir", "")
	assert.ErrorContains(t, err, "--warm needs the self-check")
}
