package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
)

func TestBackendFlagsCheck(t *testing.T) {
	tests := []struct {
		name  string
		flags backendFlags
		ok    bool
	}{
		{"docker", backendFlags{backend: backendDocker}, true},
		{"kubernetes", backendFlags{backend: backendKubernetes, namespace: "runs", runtimeClasses: []string{"runsc=gvisor"}}, true},
		{"kubernetes without namespace", backendFlags{backend: backendKubernetes}, false},
		{"namespace without kubernetes", backendFlags{backend: backendDocker, namespace: "runs"}, false},
		{"allow-unrestricted-namespace without kubernetes", backendFlags{backend: backendDocker, allowUnrestricted: true}, false},
		{"allow-unrestricted-namespace with kubernetes", backendFlags{backend: backendKubernetes, namespace: "runs", allowUnrestricted: true}, true},
		{"bad runtime class", backendFlags{backend: backendKubernetes, namespace: "runs", runtimeClasses: []string{"gvisor"}}, false},
		{"unknown backend", backendFlags{backend: "podman"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.flags.check()
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}

func TestRunOnKubernetesNamesTheAgentCommand(t *testing.T) {
	o := runOptions{executorFlags: executorFlags{backendFlags: backendFlags{backend: backendKubernetes, namespace: "runs"}, image: taskrun.DefaultImage, cpus: 1, timeout: 1, shutdownGrace: 1}}
	require.NoError(t, o.finish(nil))
	assert.Equal(t, []string{agentCommand}, o.command)

	o = runOptions{executorFlags: executorFlags{backendFlags: backendFlags{backend: backendDocker}, image: taskrun.DefaultImage, cpus: 1, timeout: 1, shutdownGrace: 1}}
	require.NoError(t, o.finish(nil))
	assert.Empty(t, o.command, "Docker runs the image's own command")
}
