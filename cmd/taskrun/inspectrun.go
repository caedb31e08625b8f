package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/termsafe"
)

// runLookupHelp ends the help of every command that names a stored run.
const runLookupHelp = `
RUN is looked up in the store's run index, in every tenant's unless --user
names one (needed when two tenants have a run of that ID).
`

// storedRunFlags are the flags of the commands that read a stored run:
// --store and --user (which narrows the search for the run ID).
type storedRunFlags struct {
	store, user string
}

func (f *storedRunFlags) define(fs *pflag.FlagSet) {
	addStoreFlag(fs, &f.store)
	fs.StringVar(&f.user, "user", "", "user (tenant) ID")
}

// openRun opens the store and finds runID in its run index. On failure it
// has reported the error and returns the exit status to use.
func (f *storedRunFlags) openRun(ctx context.Context, a *app, cmd, runID string) (*persist.Store, *runindex.Record, int) {
	st, err := persist.Open(ctx, f.store)
	if err != nil {
		fmt.Fprintf(a.stderr, "taskrun %s: --store: %v\n", cmd, err)
		return nil, nil, exitCannotRun
	}
	rec, err := runindex.Find(ctx, st, runID, f.user)
	if err != nil {
		st.Close()
		return nil, nil, a.storeError(cmd, err)
	}
	return st, rec, exitOK
}

// storeError reports err from reading a stored run and returns the exit
// status: a usage error for a run that does not exist or is ambiguous.
func (a *app) storeError(cmd string, err error) int {
	fmt.Fprintf(a.stderr, "taskrun %s: %s\n", cmd, termsafe.String(err.Error()))
	switch {
	case errors.Is(err, runindex.ErrNotFound), errors.Is(err, runindex.ErrAmbiguous),
		errors.Is(err, persist.ErrInvalidName), errors.Is(err, runindex.ErrNoObject), errors.Is(err, persist.ErrNotFound):
		return exitUsage
	}
	return exitFailure
}

// oneRunArg checks that args is exactly one run ID.
func (a *app) oneRunArg(cmd string, args []string) (string, bool) {
	if len(args) != 1 {
		a.usageError(cmd, errors.New("name one run: taskrun "+cmd+" RUN (list runs with `taskrun runs`)"))
		return "", false
	}
	return args[0], true
}

// terminalSafe wraps w in a termsafe.Writer when w is a terminal, so that
// agent-written bytes cannot drive it; flush must be called at the end.
func (a *app) terminalSafe(w io.Writer) (out io.Writer, flush func() error) {
	if !a.isTerminal(w) {
		return w, func() error { return nil }
	}
	tw := termsafe.NewWriter(w)
	return tw, tw.Flush
}
