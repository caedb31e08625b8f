package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/termsafe"
)

// serverReadHelp ends the help of the commands that read a run from the
// store or, with --server, through a control plane.
const serverReadHelp = `
With --server URL (and the user's token, --token or $TASKRUN_TOKEN, as for
taskrun submit) the run is read through that control plane's user API
instead of the store: only the user's own runs, as its workers stored them.
`

// readRunFlags are the flags of the commands that read what a run stored
// (inspect, diff, apply, cp): the store and user, or a control plane.
type readRunFlags struct {
	storedRunFlags
	api userAPIFlags
	via daemonReadFlags
}

func (f *readRunFlags) define(fs *pflag.FlagSet) {
	f.storedRunFlags.define(fs)
	f.api.define(fs)
	f.via.define(fs)
}

// readRun is a run whose stored objects are read from the store, or
// through a control plane, or through the taskrun daemon.
type readRun struct {
	rec *runindex.Record
	st  *persist.Store
	c   *client.Client
	d   *daemon.Client
}

// open finds runID in the store's run index or, with --server, asks the
// control plane for its record, or the taskrun daemon when one answers.
// On failure it has reported the error and returns the exit status to use.
func (f *readRunFlags) open(ctx context.Context, a *app, cmd, runID string) (*readRun, int) {
	if f.api.server == "" {
		d, code := f.via.dial(ctx, a, cmd)
		if code != exitOK {
			return nil, code
		}
		if d != nil {
			rec, err := d.Record(ctx, runID, f.user)
			if err != nil {
				d.Close()
				return nil, a.daemonError(cmd, err)
			}
			return &readRun{rec: rec, d: d}, exitOK
		}
		st, rec, code := f.openRun(ctx, a, cmd, runID)
		if st == nil {
			return nil, code
		}
		return &readRun{rec: rec, st: st}, exitOK
	}
	if f.user != "" {
		a.usageError(cmd, errors.New("--user: a control plane reads only the runs of its token's user; leave --user out"))
		return nil, exitUsage
	}
	c, err := f.api.client()
	if err != nil {
		a.usageError(cmd, err)
		return nil, exitUsage
	}
	raw, err := c.Record(ctx, runID)
	if err != nil {
		return nil, a.remoteError(cmd, err)
	}
	var rec runindex.Record
	if err := json.Unmarshal(raw, &rec); err != nil {
		fmt.Fprintf(a.stderr, "taskrun %s: the control plane's record of run %s: %v\n", cmd, termsafe.String(runID), err)
		return nil, exitFailure
	}
	if rec.RunID != runID {
		fmt.Fprintf(a.stderr, "taskrun %s: the control plane answered the record of run %s for run %s\n", cmd, termsafe.String(rec.RunID), termsafe.String(runID))
		return nil, exitFailure
	}
	return &readRun{rec: &rec, c: c}, exitOK
}

// Close releases the store or the daemon's connections.
func (r *readRun) Close() {
	if r.st != nil {
		r.st.Close()
	}
	if r.d != nil {
		r.d.Close()
	}
}

// execs returns the commands run in the run's container: read from the
// store, or already in the control plane's record.
func (r *readRun) execs(ctx context.Context) ([]runindex.Exec, error) {
	if r.c != nil || r.d != nil {
		return r.rec.Execs, nil
	}
	return runindex.Execs(ctx, r.st, r.rec)
}

func (r *readRun) openPatch(ctx context.Context) (io.ReadCloser, error) {
	if r.c != nil {
		return r.c.OpenPatch(ctx, r.rec.RunID)
	}
	if r.d != nil {
		return r.d.OpenObject(ctx, r.rec.RunID, r.rec.UserID, "patch", "")
	}
	return runindex.OpenPatch(ctx, r.st, r.rec)
}

func (r *readRun) openChanges(ctx context.Context) (io.ReadCloser, error) {
	if r.c != nil {
		return r.c.OpenChanges(ctx, r.rec.RunID)
	}
	if r.d != nil {
		return r.d.OpenObject(ctx, r.rec.RunID, r.rec.UserID, "changes", "")
	}
	return runindex.OpenChanges(ctx, r.st, r.rec)
}

func (r *readRun) openFile(ctx context.Context, p string) (io.ReadCloser, error) {
	if r.c != nil {
		if err := persist.ValidateRelPath(p); err != nil {
			return nil, err
		}
		return r.c.OpenFile(ctx, r.rec.RunID, p)
	}
	if r.d != nil {
		return r.d.OpenObject(ctx, r.rec.RunID, r.rec.UserID, "file", p)
	}
	return runindex.OpenFile(ctx, r.st, r.rec, p)
}

// readError reports err from reading one of the run's objects and returns
// the exit status.
func (a *app) readError(cmd string, err error) int {
	var he *client.HTTPError
	if errors.As(err, &he) {
		return a.remoteError(cmd, err)
	}
	var re *daemon.RefusedError
	if errors.As(err, &re) || errors.Is(err, daemon.ErrDaemonGone) {
		return a.daemonError(cmd, err)
	}
	return a.storeError(cmd, err)
}

// remoteError reports an error of the control plane and returns the exit
// status: a usage error for a run (or object) it does not have.
func (a *app) remoteError(cmd string, err error) int {
	fmt.Fprintf(a.stderr, "taskrun %s: %s\n", cmd, termsafe.String(err.Error()))
	var he *client.HTTPError
	if errors.Is(err, client.ErrNotFound) || (errors.As(err, &he) && he.StatusCode == 400) {
		return exitUsage
	}
	return exitFailure
}
