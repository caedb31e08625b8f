package docker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/taskrun/taskrun/sandbox"
)

// maxHeldBytes bounds what a parked container may print before it is
// activated (its gate prints nothing unless it fails); more is dropped.
const maxHeldBytes = 64 << 10

// ErrActivated is returned by a second Activate of a parked container.
var ErrActivated = errors.New("parked container was already activated")

// parked is a container started by Park, waiting at its gate.
type parked struct {
	*handle
	stdout, stderr *heldWriter
	// imgEntrypoint and imgCmd are the image's own, read when parking, so
	// that Activate needs no engine call.
	imgEntrypoint, imgCmd []string
	mu                    sync.Mutex
	active                bool
}

// Park creates, attaches and starts a container whose command is the gate
// in spec (sandbox.Parker). Its output is held until Activate. The image's
// entrypoint and command are looked up now, for the run's command.
func (b *Backend) Park(ctx context.Context, spec sandbox.Spec, pol sandbox.Policy) (sandbox.Parked, error) {
	if err := pol.Validate(); err != nil {
		return nil, err
	}
	if err := validateSpec(spec); err != nil {
		return nil, err
	}
	if spec.StopGrace <= 0 {
		spec.StopGrace = b.stopGrace
	}
	info, err := b.api.ImageInspect(ctx, spec.Image)
	if err != nil {
		return nil, b.createError(spec, err)
	}
	p := &parked{stdout: &heldWriter{}, stderr: &heldWriter{}}
	if info.Config != nil {
		p.imgEntrypoint, p.imgCmd = info.Config.Entrypoint, info.Config.Cmd
	}
	if spec, err = b.resolveWrapper(ctx, spec); err != nil {
		return nil, err
	}
	cc := convert(spec, pol, b.now(), b.expirySlack)
	setInstance(cc.Config.Labels, b.instance, b.instanceProcess)
	created, err := b.api.ContainerCreate(ctx, cc.Config, cc.Host, cc.Network, cc.Name)
	if err != nil && cc.Name != "" && isConflict(err) {
		created, err = b.api.ContainerCreate(ctx, cc.Config, cc.Host, cc.Network, cc.Name+"-"+strings.ToLower(rand.Text()[:8]))
	}
	if err != nil {
		return nil, b.createError(spec, err)
	}
	h := newHandle(b, created.ID, spec, sandbox.Streams{Stdout: p.stdout, Stderr: p.stderr})
	if err := h.start(ctx, nil); err != nil { // parked ahead of any run: nothing to time
		h.discard(ctx)
		return nil, err
	}
	b.register(h)
	p.handle = h
	b.log.DebugContext(ctx, "sandbox parked", "container", h.id, "image", spec.Image, "runtime", pol.Runtime)
	return p, nil
}

// Activate hands the parked container to a run (sandbox.Parked).
func (p *parked) Activate(_ context.Context, spec sandbox.Spec, streams sandbox.Streams) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.active {
		return nil, ErrActivated
	}
	var argv []string
	if len(spec.Wrapper) > 0 {
		wrapped, err := wrapCommand(spec, p.imgEntrypoint, p.imgCmd)
		if err != nil {
			return nil, err
		}
		argv = append(slices.Clone(wrapped.Entrypoint), wrapped.Cmd...)
	} else {
		ep, cmd := p.imgEntrypoint, p.imgCmd
		switch {
		case len(spec.Entrypoint) > 0:
			ep, cmd = spec.Entrypoint, spec.Cmd
		case len(spec.Cmd) > 0:
			cmd = spec.Cmd
		}
		argv = append(slices.Clone(ep), cmd...)
		if len(argv) == 0 {
			return nil, fmt.Errorf("sandbox spec: image %q has no command to run; give one after `--`", p.spec.Image)
		}
	}
	p.active = true
	p.handle.spec.Timeout = spec.Timeout
	if spec.StopGrace > 0 {
		p.handle.spec.StopGrace = spec.StopGrace
	}
	p.handle.started = time.Now()
	p.stdout.release(streams.Stdout)
	p.stderr.release(streams.Stderr)
	return argv, nil
}

// heldWriter holds what is written to it (up to maxHeldBytes) until
// release, then writes that and everything after it through.
type heldWriter struct {
	mu      sync.Mutex
	w       io.Writer
	held    []byte
	dropped int64
}

// Write implements io.Writer.
func (h *heldWriter) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.w != nil {
		return h.w.Write(p)
	}
	room := maxHeldBytes - len(h.held)
	keep := min(room, len(p))
	h.held = append(h.held, p[:keep]...)
	h.dropped += int64(len(p) - keep)
	return len(p), nil
}

// release writes the held bytes to w and passes later writes through; a nil
// w discards.
func (h *heldWriter) release(w io.Writer) {
	if w == nil {
		w = io.Discard
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.held) > 0 {
		_, _ = w.Write(h.held)
	}
	h.held = nil
	h.w = w
}

var _ sandbox.Parker = (*Backend)(nil)
