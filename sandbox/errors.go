package sandbox

import "errors"

// Errors a Backend wraps so that callers can tell the cause with errors.Is.
var (
	// ErrDaemonUnavailable means the container engine could not be reached.
	ErrDaemonUnavailable = errors.New("container engine unavailable")
	// ErrImageNotFound means the Spec's image does not exist locally and
	// was not pulled (the pull policy is never), or its registry has no
	// such image.
	ErrImageNotFound = errors.New("image not found")
	// ErrImagePull means pulling the image from its registry failed.
	ErrImagePull = errors.New("image pull failed")
	// ErrRegistryAuth means the registry refused the credentials (or the
	// lack of them) the pull presented.
	ErrRegistryAuth = errors.New("registry refused the credentials")
	// ErrImageUnusable means the image exists but its command cannot start
	// under the sandbox policy (not executable by the run's uid, missing,
	// or a missing interpreter or loader).
	ErrImageUnusable = errors.New("image cannot start in the sandbox")
	// ErrContainerGone means the container no longer exists, or the engine
	// already marked it dead or for removal: what it held (its log) is
	// gone with it.
	ErrContainerGone = errors.New("container is gone")
)
