// Package unixsock listens on the unix sockets the executor shares with a
// run's container: in a directory the container cannot modify, owned by (or,
// for a non-root executor, open to) the agent's uid, at paths longer than
// the kernel's limit for socket names.
package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// MaxPath is the longest path bind(2) takes for a unix socket (sun_path is
// 108 bytes on Linux, including the terminating NUL); Listen binds longer
// ones through a shorter alias.
const MaxPath = 107

// Listen creates path's directory (mode 0755, so the container can reach
// but not replace the socket), removes a stale socket, listens, and shares
// the socket with uid: chowned to it and 0600 when running as root, 0777
// otherwise (a non-root process cannot chown; keep the run directory
// traversable only by the executor and the agent's uid).
func Listen(path string, uid int) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("open socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := listen(path)
	if err != nil {
		return nil, err
	}
	if err := share(path, uid); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// listen binds path, through the short /proc/self/fd/N alias of its opened
// directory when path is too long for bind(2).
func listen(path string) (net.Listener, error) {
	if len(path) <= MaxPath {
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("listen on socket: %w", err)
		}
		return ln, nil
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("open socket directory: %w", err)
	}
	defer dir.Close()
	alias := fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	ln, err := net.Listen("unix", alias)
	if err != nil {
		return nil, fmt.Errorf("listen on socket (path longer than %d bytes, bound via %s): %w", MaxPath, alias, err)
	}
	// The listener would unlink its alias on Close; the caller removes the real path.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	return ln, nil
}

func share(path string, uid int) error {
	if os.Geteuid() == 0 {
		if err := os.Chown(path, uid, uid); err != nil {
			return fmt.Errorf("chown socket to uid %d: %w", uid, err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			return fmt.Errorf("chmod socket: %w", err)
		}
		return nil
	}
	if err := os.Chmod(path, 0o777); err != nil {
		return fmt.Errorf("chmod socket: %w", err)
	}
	return nil
}

// Dial connects to the unix socket at path, through the short
// /proc/self/fd/N alias of its opened directory when path is too long for
// connect(2) (as Listen binds it).
func Dial(path string) (net.Conn, error) {
	if len(path) <= MaxPath {
		return net.Dial("unix", path)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("open socket directory: %w", err)
	}
	defer dir.Close()
	c, err := net.Dial("unix", fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
	if err != nil {
		return nil, fmt.Errorf("dial %s (path longer than %d bytes): %w", path, MaxPath, err)
	}
	return c, nil
}
