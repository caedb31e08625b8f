package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/user"
	"strconv"

	"golang.org/x/sys/unix"
)

// Peer is the process at the other end of a connection, as the kernel
// saw it when it connected (SO_PEERCRED).
type Peer struct {
	PID      int32
	UID, GID uint32
}

type peerKey struct{}

// peerResult is a connection's peer, or why it is unknown.
type peerResult struct {
	peer Peer
	err  error
}

// withPeer is the http.Server ConnContext hook: it reads c's peer
// credentials once, when the connection is accepted.
func withPeer(ctx context.Context, c net.Conn) context.Context {
	p, err := peerOf(c)
	return context.WithValue(ctx, peerKey{}, peerResult{p, err})
}

// peerFrom is the peer withPeer read for the request's connection.
func peerFrom(ctx context.Context) (Peer, error) {
	r, ok := ctx.Value(peerKey{}).(peerResult)
	if !ok {
		return Peer{}, errors.New("no peer credentials on this connection")
	}
	return r.peer, r.err
}

// peerOf reads the SO_PEERCRED credentials of a unix socket connection.
func peerOf(c net.Conn) (Peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Peer{}, fmt.Errorf("connection %T is not a unix socket: peer credentials are unknown", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Peer{}, err
	}
	if credErr != nil {
		return Peer{}, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return Peer{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid}, nil
}

// UserNameTenant is the default tenant of a uid: its user name, else
// "uid-N" for a uid with no passwd entry.
func UserNameTenant(uid uint32) (string, error) {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		var unknown user.UnknownUserIdError
		if errors.As(err, &unknown) {
			return "uid-" + strconv.FormatUint(uint64(uid), 10), nil
		}
		return "", err
	}
	return u.Username, nil
}
