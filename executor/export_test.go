package executor

import (
	"context"

	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/warmpool"
)

// The phase tests drive the pipeline with a whole input, the machine and
// the run in one value, without building a Host for each variation. These
// names exist only in tests: everything else goes through New and
// Host.Run.

// Input is the pipeline's input (runInput).
type Input = runInput

// withRoot gives a test's input the runs root of its Paths, as a Host
// gives its layout's.
func withRoot(in Input) Input {
	if rp, ok := in.Paths.(interface{ Root() string }); ok && in.root == "" {
		in.root = rp.Root()
	}
	return in
}

// Execute runs in end to end (Host.Run without a Host).
func Execute(ctx context.Context, in Input) (*Outcome, error) {
	return execute(ctx, withRoot(in))
}

// RetryPersist finishes in's kept run (Host.RetryPersist without a Host).
func RetryPersist(ctx context.Context, in Input) (*Outcome, error) {
	return retryPersist(ctx, withRoot(in))
}

// WarmTemplate is the pool key of runs shaped like in (Host.WarmTemplate
// without a Host).
func WarmTemplate(ctx context.Context, in Input) (warmpool.Template, error) {
	return warmTemplate(ctx, withRoot(in))
}

// RecoverRun finishes a journaled run (recoverRun).
func RecoverRun(ctx context.Context, in Input, rec journal.Record) (*Outcome, error) {
	return recoverRun(ctx, withRoot(in), rec)
}

// Input is the host's input for spec (runInput).
func (h *Host) Input(spec Spec) Input { return h.runInput(spec) }

// RecoveryInput is the input that names a journaled run (recoveryInput).
func (h *Host) RecoveryInput(ctx context.Context, rec journal.Record) (Input, func(), error) {
	return h.recoveryInput(ctx, rec)
}
