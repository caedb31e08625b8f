// Package dockertest runs one-off containers for package tests that need a
// hardened fixture outside a task run (the gateway's and the egress proxy's
// container tests). It depends on nothing in taskrun, so any package's
// internal tests can use it.
package dockertest

import (
	"bytes"
	"context"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
)

// Run creates and starts a container from cfg and host, waits for it to exit
// and returns what it wrote to stdout and stderr. The container is removed
// when tb ends.
func Run(ctx context.Context, tb testing.TB, cli *client.Client, cfg *container.Config, host *container.HostConfig) (stdout, stderr string) {
	tb.Helper()
	created, err := cli.ContainerCreate(ctx, cfg, host, nil, nil, "")
	if err != nil {
		tb.Fatalf("create container: %v", err)
	}
	tb.Cleanup(func() {
		_ = cli.ContainerRemove(context.Background(), created.ID, container.RemoveOptions{Force: true})
	})
	if err := cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		tb.Fatalf("start container: %v", err)
	}
	waitC, errC := cli.ContainerWait(ctx, created.ID, container.WaitConditionNotRunning)
	select {
	case err := <-errC:
		tb.Fatalf("wait for container: %v", err)
	case w := <-waitC:
		if w.Error != nil {
			tb.Fatalf("wait for container: %s", w.Error.Message)
		}
	}
	logs, err := cli.ContainerLogs(ctx, created.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		tb.Fatalf("container logs: %v", err)
	}
	defer logs.Close()
	var out, errOut bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &errOut, logs); err != nil {
		tb.Fatalf("read container logs: %v", err)
	}
	return out.String(), errOut.String()
}
