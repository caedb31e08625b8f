package warmpool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/taskrun/taskrun/diskcap"
)

// hostDirSuffix names a claimed slot's executor directory (output spools),
// beside its run directory.
const hostDirSuffix = ".executor"

// Sweep removes what the pools of gone executors left under dir (a
// Config.Dir): each slot's disk cap, run directory and executor directory,
// then the instance's directory. gone reports whether the executor of an
// instance ID is gone; keep spares a path a journaled run still needs (a run
// recovered but kept on the host for a persist retry). Recover journaled
// runs first: a claimed slot is a run's directory until then. It returns
// the slot directories it removed.
func Sweep(dir string, gone func(instance string) bool, keep func(path string) bool) ([]string, error) {
	instances, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("warmpool: sweep %s: %w", dir, err)
	}
	var removed []string
	var errs []error
	for _, inst := range instances {
		if !inst.IsDir() || !gone(inst.Name()) {
			continue
		}
		idir := filepath.Join(dir, inst.Name())
		entries, err := os.ReadDir(idir)
		if err != nil {
			errs = append(errs, fmt.Errorf("warmpool: sweep %s: %w", idir, err))
			continue
		}
		for _, e := range entries {
			name := e.Name()
			if !e.IsDir() || !strings.HasPrefix(name, "pool-") || strings.HasSuffix(name, hostDirSuffix) {
				continue
			}
			slot := filepath.Join(idir, name)
			if keep(slot) || keep(slot+hostDirSuffix) {
				continue
			}
			if err := diskcap.Release(slot); err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, os.RemoveAll(slot), os.RemoveAll(slot+hostDirSuffix))
			removed = append(removed, slot)
		}
		// Removed only once empty: kept runs stay.
		_ = os.Remove(idir)
	}
	return removed, errors.Join(errs...)
}
