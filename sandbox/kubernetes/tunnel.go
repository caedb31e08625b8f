package kubernetes

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/taskrun/taskrun/helpers/podhelper"
	"github.com/taskrun/taskrun/internal/unixsock"
	"github.com/taskrun/taskrun/sandbox"
)

// socketDepth is how deep below a mount's top the executor's sockets are
// looked for (the run dir's .gateway/ holds them).
const socketDepth = 2

// podSocket is one of the executor's unix sockets in a mounted directory,
// served in the Pod through the model tunnel.
type podSocket struct {
	Host string // the executor's socket
	Pod  string // its path in the keeper's data volume
}

// findSockets lists the unix sockets at most socketDepth levels below each
// read-write directory mount: the executor's (model gateway, egress proxy),
// which the fill stream cannot carry.
func findSockets(mounts []sandbox.Mount) ([]podSocket, error) {
	var out []podSocket
	for i, m := range mounts {
		if m.ReadOnly {
			continue
		}
		if info, err := os.Stat(m.Source); err != nil || !info.IsDir() {
			continue
		}
		err := filepath.WalkDir(m.Source, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil // unreadable: nothing of the executor's there
			}
			rel, _ := filepath.Rel(m.Source, p)
			if d.IsDir() && rel != "." && strings.Count(rel, string(filepath.Separator)) >= socketDepth-1 {
				return filepath.SkipDir
			}
			if d.Type()&fs.ModeSocket != 0 {
				out = append(out, podSocket{Host: p, Pod: path.Join(podhelper.DataDir, podhelper.SectionName(i), filepath.ToSlash(rel))})
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// startTunnels keeps one tunnel session waiting for each socket, and
// returns once every socket has one registered with the keeper (so an agent
// connecting after the gate opens is served).
func (h *handle) startTunnels(ctx context.Context, sockets []podSocket) error {
	for _, s := range sockets {
		ready := make(chan struct{})
		go h.tunnelPool(s, ready)
		select {
		case <-ready:
		case <-ctx.Done():
			return fmt.Errorf("pod %s: the tunnel to %s never became ready: %w", h.name, s.Host, context.Cause(ctx))
		}
	}
	return nil
}

// tunnelPool runs tunnel sessions for one socket until the run ends: one
// waits at all times; when it is paired with an agent connection, the
// next one starts.
func (h *handle) tunnelPool(s podSocket, ready chan struct{}) {
	readyOnce := false
	for h.runCtx.Err() == nil {
		paired, ended := make(chan struct{}), make(chan struct{})
		outR, outW := io.Pipe()
		inR, inW := io.Pipe()
		go func() {
			err := h.b.exec(h.runCtx, h.name, ContainerKeep, podhelper.TunnelCommand(s.Pod), streamIO{Stdin: inR, Stdout: outW})
			outW.CloseWithError(err)
			inR.Close()
		}()
		markReady := func() {
			if !readyOnce {
				readyOnce = true
				close(ready)
			}
		}
		go func() {
			defer close(ended)
			err := podhelper.Carry(outR, inW, markReady, func() { close(paired) }, func() (net.Conn, error) {
				return unixsock.Dial(s.Host)
			})
			if err != nil && h.runCtx.Err() == nil {
				h.b.log.Debug("tunnel session ended", "pod", h.name, "socket", s.Host, "err", err)
			}
			outR.Close()
		}()
		select {
		case <-paired:
		case <-ended:
			select {
			case <-time.After(200 * time.Millisecond):
			case <-h.runCtx.Done():
			}
		case <-h.runCtx.Done():
		}
	}
}
