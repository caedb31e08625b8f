package sandbox

import "context"

// Parker is implemented by backends that can start a container ahead of the
// run it will serve (package warmpool keeps a pool of them). Park creates the
// container with spec and policy exactly as Start would, attaches to its
// output before starting it, registers the wait for its exit and starts it.
// spec's command is the gate (the self-check helper waiting to be told what
// to run); nothing the container prints before Activate is lost: it is held
// (bounded) and delivered to the run's Streams first. On error nothing is
// left behind. The parked container counts as live for the backend's reaper.
type Parker interface {
	Park(ctx context.Context, spec Spec, policy Policy) (Parked, error)
}

// Parked is a container started by Parker.Park and waiting at its gate. It
// is a Handle: Posture may be read while parked, and Close removes it
// whether or not it was activated. Wait may be called only after Activate.
type Parked interface {
	Handle
	// Activate hands the parked container to a run right before its gate is
	// released: it routes the output held since the start, then everything
	// after it, to streams, and restarts the clock of spec.Timeout (and
	// spec.StopGrace) from now. It returns the command the gate must run:
	// spec.Wrapper in front of spec's command, or of the image's own
	// entrypoint and command when spec sets none (as Start resolves it).
	// Only spec's Wrapper, Entrypoint, Cmd, Timeout and StopGrace are read;
	// everything else was fixed when the container was parked. It may be
	// called once.
	Activate(ctx context.Context, spec Spec, streams Streams) (argv []string, err error)
}
