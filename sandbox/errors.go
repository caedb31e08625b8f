package sandbox

import "errors"

// Errors a Backend wraps so that callers can tell the cause with errors.Is.
var (
	// ErrDaemonUnavailable means the container engine could not be reached.
	ErrDaemonUnavailable = errors.New("container engine unavailable")
	// ErrImageNotFound means the Spec's image does not exist locally; backends never pull.
	ErrImageNotFound = errors.New("image not found locally")
)
