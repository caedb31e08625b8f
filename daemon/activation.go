package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
)

// Environment variables of systemd's socket activation (sd_listen_fds(3)).
const (
	EnvListenPID     = "LISTEN_PID"
	EnvListenFDs     = "LISTEN_FDS"
	EnvListenFDNames = "LISTEN_FDNAMES"
)

// listenFDsStart is the first descriptor systemd passes (SD_LISTEN_FDS_START).
const listenFDsStart = 3

// ErrActivation is wrapped by errors about the sockets systemd passed.
var ErrActivation = errors.New("daemon: socket activation")

// activationFDs reads the socket-activation variables as sd_listen_fds(3)
// does: the descriptors from 3 on, LISTEN_FDS of them, passed to pid only.
// With no LISTEN_PID, or one naming another process (the variables were
// inherited, not passed), there are none.
func activationFDs(getenv func(string) string, pid int) ([]int, error) {
	spid := getenv(EnvListenPID)
	if spid == "" {
		return nil, nil
	}
	p, err := strconv.Atoi(spid)
	if err != nil {
		return nil, fmt.Errorf("%w: %s=%q is not a process id", ErrActivation, EnvListenPID, spid)
	}
	if p != pid {
		return nil, nil
	}
	sn := getenv(EnvListenFDs)
	n, err := strconv.Atoi(sn)
	if err != nil || n < 0 {
		return nil, fmt.Errorf("%w: %s=%q is not a count of descriptors", ErrActivation, EnvListenFDs, sn)
	}
	fds := make([]int, n)
	for i := range fds {
		fds[i] = listenFDsStart + i
	}
	return fds, nil
}

// ActivationListener is the socket systemd passed this process (a
// taskrun.socket unit, see examples/systemd), or nil when it passed none.
// It must be one listening unix stream socket: the daemon reads each
// client's uid from it. The variables are unset, so that no child
// inherits them, and the descriptors are made close-on-exec.
func ActivationListener() (net.Listener, error) {
	fds, err := activationFDs(os.Getenv, os.Getpid())
	for _, name := range []string{EnvListenPID, EnvListenFDs, EnvListenFDNames} {
		_ = os.Unsetenv(name)
	}
	if err != nil || len(fds) == 0 {
		return nil, err
	}
	for _, fd := range fds {
		syscall.CloseOnExec(fd)
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			_ = syscall.Close(fd)
		}
		return nil, fmt.Errorf("%w: %d sockets passed: give the daemon one ListenStream= unix socket", ErrActivation, len(fds))
	}
	f := os.NewFile(uintptr(fds[0]), "systemd-socket")
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("%w: descriptor %d: %w", ErrActivation, fds[0], err)
	}
	if _, ok := l.(*net.UnixListener); !ok {
		l.Close()
		return nil, fmt.Errorf("%w: descriptor %d is a %s socket: give the daemon a ListenStream= unix socket path, whose peers' uids it can read", ErrActivation, fds[0], l.Addr().Network())
	}
	return l, nil
}
