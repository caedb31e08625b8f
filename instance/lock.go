package instance

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// ErrLocked is returned by TryLock when another open file (in this process or
// another) holds the lock.
var ErrLocked = errors.New("lock is held")

// Lock is an exclusive flock(2) on a file. The kernel releases it when the
// holder's process dies, however it dies.
type Lock struct {
	path string
	f    *os.File
}

// TryLock creates path if missing and takes an exclusive lock on it without
// waiting; it returns an error wrapping ErrLocked when the lock is held. The
// lock is taken on the file path names when TryLock returns: a file removed
// and recreated meanwhile by its holder is retried.
func TryLock(path string) (*Lock, error) {
	for range 10 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errnoIs(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("%s: %w", path, ErrLocked)
			}
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		// The holder removes the file before it unlocks: a lock taken on a
		// file no longer at path protects nothing, so try again.
		same, err := samePath(f, path)
		if err != nil {
			f.Close()
			return nil, err
		}
		if same {
			return &Lock{path: path, f: f}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("%s: %w (it keeps being replaced)", path, ErrLocked)
}

// Held reports whether some open file holds the lock on path (an error
// wrapping fs.ErrNotExist when there is no such file). It never creates path.
func Held(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errnoIs(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("flock %s: %w", path, err)
	}
	// Closing f releases the probe's lock.
	return false, nil
}

// samePath reports whether path still names the file f has open.
func samePath(f *os.File, path string) (bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	pi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return os.SameFile(fi, pi), nil
}

// Path returns the locked file.
func (l *Lock) Path() string { return l.path }

// WriteContent replaces the lock file's content with data and syncs it.
func (l *Lock) WriteContent(data []byte) error {
	if err := l.f.Truncate(0); err != nil {
		return err
	}
	if _, err := l.f.WriteAt(data, 0); err != nil {
		return err
	}
	return l.f.Sync()
}

// Unlock releases the lock; with remove it first removes the file, so that
// no one can take a lock on a file that is about to vanish. It is safe to
// call more than once.
func (l *Lock) Unlock(remove bool) error {
	if l.f == nil {
		return nil
	}
	var err error
	if remove {
		if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = rerr
		}
	}
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}
