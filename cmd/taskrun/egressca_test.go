package main

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/egress"
)

// --egress-ca loads an operator's CA bundle for `run`, `worker` and
// `daemon`, and refuses a file without a certificate.
func TestEgressCAFlag(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	bundle := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644))
	bad := filepath.Join(dir, "bad.pem")
	require.NoError(t, os.WriteFile(bad, []byte("no certificate"), 0o644))

	o, err := parseRunFlags(nil)
	require.NoError(t, err)
	assert.Nil(t, o.egressRoots, "no flag: the system roots")
	o, err = parseRunFlags([]string{"--egress-ca", bundle})
	require.NoError(t, err)
	require.NotNil(t, o.egressRoots)
	assert.Equal(t, "--egress-ca", o.machineFlag(), "the bundle is this host's: the run executes here")
	_, err = parseRunFlags([]string{"--egress-ca", bad})
	require.ErrorIs(t, err, egress.ErrBadConfig)
	assert.ErrorContains(t, err, "--egress-ca")

	w, err := parseWorker(t, "--egress-ca", bundle)
	require.NoError(t, err)
	assert.NotNil(t, w.egressRoots)
	_, err = parseWorker(t, "--egress-ca", bad)
	require.ErrorIs(t, err, egress.ErrBadConfig)

	var d daemonOptions
	fs := pflag.NewFlagSet("daemon", pflag.ContinueOnError)
	d.define(fs)
	require.NoError(t, fs.Parse([]string{"--egress-ca", bundle}))
	require.NoError(t, d.finish())
	assert.NotNil(t, d.egressRoots)
}
