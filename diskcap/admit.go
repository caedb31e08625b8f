package diskcap

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/docker/go-units"
)

// ErrNoRoom is wrapped by Admit when the filesystem has less free space than
// a run needs.
var ErrNoRoom = errors.New("not enough free disk space for the run")

// Free returns the bytes an unprivileged writer can still allocate on the
// filesystem holding dir (statfs f_bavail).
func Free(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("diskcap: statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// Admit refuses, with an error wrapping ErrNoRoom that names both numbers, a
// run that needs need bytes on the filesystem of dir (its disk cap, the
// spools it may write, its records) when less is free. Images made by Mount
// are fully allocated, so admitted runs cannot overcommit the filesystem
// through their caps.
func Admit(dir string, need int64) error {
	free, err := Free(dir)
	if err != nil {
		return err
	}
	if free < need {
		return fmt.Errorf("%w: runs root %s has %s free, this run needs %s (its disk cap plus output spools); free space there, or lower --disk or --max-output",
			ErrNoRoom, dir, units.BytesSize(float64(free)), units.BytesSize(float64(need)))
	}
	return nil
}
