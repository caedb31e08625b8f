package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/termsafe"
)

// daemonReadHelp ends the help of the commands that read runs through the
// taskrun daemon when one answers.
const daemonReadHelp = `
When a taskrun daemon answers (see taskrun run) and no --store, --root,
--server or --namespace is given, the run is read through the daemon, from
its store: as a user other than root, only your tenant's runs (another
user's run is not found). --local reads in this process instead.
`

// readMachineFlags name a machine of their own: given, the command reads in
// this process, not through the daemon.
var readMachineFlags = map[string]bool{
	"store": true, "root": true, "server": true, "token": true, "namespace": true, "kubeconfig": true,
}

// daemonReadFlags choose whether a read goes through the taskrun daemon.
type daemonReadFlags struct {
	fs    *pflag.FlagSet
	local bool
}

func (f *daemonReadFlags) define(fs *pflag.FlagSet) {
	f.fs = fs
	fs.BoolVar(&f.local, "local", false, "read in this process even when a taskrun daemon answers (see taskrun daemon)")
}

// dial is the daemon to read through: nil with no error when the read
// stays in this process (--local, a machine flag, or no daemon answers).
// On failure it has reported the error and returns the exit status.
func (f *daemonReadFlags) dial(ctx context.Context, a *app, cmd string) (*daemon.Client, int) {
	if f.local {
		return nil, exitOK
	}
	machine := false
	f.fs.Visit(func(fl *pflag.Flag) {
		if readMachineFlags[fl.Name] {
			machine = true
		}
	})
	if machine {
		return nil, exitOK
	}
	c, err := daemon.DialFirst(ctx, daemon.ClientSocketPaths())
	if errors.Is(err, daemon.ErrNoDaemon) {
		return nil, exitOK
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "taskrun %s: %s; pass --local to read in this process\n", cmd, oneLine(err))
		return nil, exitCannotRun
	}
	a.log.Debug("reading through the taskrun daemon", "socket", c.Path())
	return c, exitOK
}

// daemonError reports err from the daemon and returns the exit status, as
// the in-process command would: a usage error for a run or object that is
// not there (or not the caller's) and for a refused --user.
func (a *app) daemonError(cmd string, err error) int {
	fmt.Fprintf(a.stderr, "taskrun %s: %s\n", cmd, termsafe.String(err.Error()))
	var re *daemon.RefusedError
	if errors.As(err, &re) && (re.Status == http.StatusNotFound || re.Status == http.StatusForbidden) {
		return exitUsage
	}
	return exitFailure
}
