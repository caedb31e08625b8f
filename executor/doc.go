// Package executor runs taskrun runs: the run pipeline (Host.Run), and the
// machine it runs on, one Host per executor process, built once, with a
// Spec per run handed to it.
//
// # Host vs Spec
//
// A Host (New, from a Config) is everything the same for every run on the
// host: the runs root (Layout: run directories, journal, warm pool,
// executor locks, uid leases, disk cap images, helpers), the backend, the
// store, the uid pool, the warm pool, the in-sandbox helpers, the
// executor's identity, attestation key and version, the control plane the
// runs report to, the operator's image rules and the defaults (image,
// policy, limits, deadlines, shutdown grace). New checks the whole once, so
// that a host that would fail, or silently run weaker, on its first run
// does not start: a warm pool runs on the host's backend and leases from
// its uid pool by construction, and the layout always has a journal.
//
// A Spec is one run: the task, run and session, the updater and stream,
// the image, command, environment, model and egress, and the limits it
// overrides. Host.Run executes it.
//
//	layout, _ := executor.NewLayout(root)
//	inst, _ := layout.StartInstance()
//	h, err := executor.New(ctx, executor.Config{Root: root, Backend: b, Store: s, Executor: inst.Info(), ...})
//	h.Recover(ctx)                 // what earlier executors of root left
//	out, err := h.Run(ctx, spec)   // one run
//
// Host.Recover and Host.RetryKept finish what earlier executors of the runs
// root left: the journaled runs of gone executors are stored and reported,
// their containers reaped, and runs whose storing failed retried.
//
// # The pipeline
//
// Host.Run composes the pipeline's input (input.go) from the host's Config
// and the Spec and executes it (run.go); Host.RetryPersist and recovery
// finish a kept or journaled run the same way (keptrun.go, recover.go). A
// run is planned, admitted and journaled (plan.go, crashsafe.go) and handed
// to the runner (runner.go), the only code that sequences a run: each
// concern is a hook (*_hook.go, hooks.go), and every state change leaves
// through one tracer (trace.go).
//
// The module root, package taskrun, is the seed's facade over this
// package: its RunTask builds a Host from a RunTaskInput (New, with
// Config.Paths, Artifacts and WarmPool for what the seed input carries)
// and calls Host.Run. This package never imports the root.
package executor
