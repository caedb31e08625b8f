package diskcap

import (
	"errors"
	"fmt"
	"syscall"
)

// ErrNoInodes is wrapped by Explain when a capped filesystem ran out of
// inodes: it holds as many files and directories as it can.
var ErrNoInodes = errors.New("the run's disk cap has no inodes left")

// ErrCapFull is wrapped by Explain when a capped filesystem ran out of
// space.
var ErrCapFull = errors.New("the run's disk cap is full")

// Explain names the cause of err, a write under dir that failed with
// ENOSPC: the filesystem's inodes or its bytes, with its numbers and the
// fix. Any other error, or one whose cause statfs cannot tell, is returned
// as it is.
func Explain(dir string, err error) error {
	if err == nil || !errors.Is(err, syscall.ENOSPC) {
		return err
	}
	var st syscall.Statfs_t
	if serr := syscall.Statfs(dir, &st); serr != nil {
		return err
	}
	switch {
	case st.Ffree == 0:
		return fmt.Errorf("%w: all its %d inodes (one per file or directory) are used: the files need more inodes than the cap allows; raise the disk limit or hold fewer files: %w",
			ErrNoInodes, st.Files, err)
	case st.Bavail == 0:
		return fmt.Errorf("%w: all its %d bytes are used; raise the disk limit or hold less: %w", ErrCapFull, int64(st.Blocks)*st.Bsize, err)
	}
	return err
}
