package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/docker/docker/client"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
)

// Exit statuses of `taskrun audit`.
const (
	auditExitPass  = 0 // every rule passed or was not applicable
	auditExitFail  = 1 // at least one rule failed
	auditExitError = 2 // usage error, unreadable record or Docker daemon error
)

const auditUsage = `usage: taskrun audit [flags] CONTAINER...
       taskrun audit [flags] --all
       taskrun audit [flags] --record FILE

Checks containers against CIS Docker Benchmark 1.6.0 §5, PSS restricted and
taskrun's own rules. --all audits every container labelled ` + sandbox.LabelManaged + `=true.
--record re-checks a stored isolation record (audit.json).
Exit status: 0 all rules pass, 1 a rule fails, 2 usage or daemon error.

flags:
`

type auditFlags struct {
	all, json, requireGVisor bool
	record, networks         string
	runsRoot, store          string
}

// runAudit implements `taskrun audit`.
func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, targets, err := parseAuditFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return auditExitPass
	}
	if err != nil {
		fmt.Fprintf(stderr, "taskrun audit: %v\n", err)
		return auditExitError
	}
	opts := audit.Options{RequireGVisor: f.requireGVisor, Mounts: audit.MountPolicy{RunsRoot: f.runsRoot}}
	if f.networks != "" {
		opts.AllowedNetworkModes = strings.Split(f.networks, ",")
	}
	var reports []audit.Report
	if f.record != "" {
		reports, err = auditRecord(ctx, f.store, f.record)
	} else {
		reports, err = auditLive(ctx, f.all, targets, opts)
	}
	if err != nil {
		fmt.Fprintf(stderr, "taskrun audit: %v\n", err)
		return auditExitError
	}
	if err := writeAuditReports(stdout, reports, f.json); err != nil {
		fmt.Fprintf(stderr, "taskrun audit: write report: %v\n", err)
		return auditExitError
	}
	for _, r := range reports {
		if r.Failed() {
			return auditExitFail
		}
	}
	return auditExitPass
}

func parseAuditFlags(args []string, stderr io.Writer) (auditFlags, []string, error) {
	var f auditFlags
	fs := flag.NewFlagSet("taskrun audit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, auditUsage)
		fs.PrintDefaults()
	}
	fs.BoolVar(&f.all, "all", false, "audit every container labelled "+sandbox.LabelManaged+"=true")
	fs.BoolVar(&f.json, "json", false, "print the reports as JSON")
	fs.StringVar(&f.record, "record", "", "re-check the isolation record in this local file (audit.json), or at this key of --store")
	fs.StringVar(&f.store, "store", "", "blob store URL holding the record, e.g. file://./.taskrun/store; --record is then the object key")
	fs.BoolVar(&f.requireGVisor, "require-gvisor", false, "fail containers not running under runsc")
	fs.StringVar(&f.networks, "networks", "", "comma-separated network modes to allow (default none)")
	fs.StringVar(&f.runsRoot, "runs-root", "", "host directory every run dir must lie under")
	if err := fs.Parse(args); err != nil {
		return f, nil, err
	}
	targets := fs.Args()
	modes := 0
	for _, on := range []bool{f.all, f.record != "", len(targets) > 0} {
		if on {
			modes++
		}
	}
	if modes != 1 {
		fs.Usage()
		return f, nil, errors.New("name containers, or pass --all, or pass --record FILE (exactly one of them)")
	}
	return f, targets, nil
}

func auditLive(ctx context.Context, all bool, ids []string, opts audit.Options) ([]audit.Report, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker client (check DOCKER_HOST): %w", err)
	}
	defer cli.Close()
	if all {
		if ids, err = audit.ManagedIDs(ctx, cli); err != nil {
			return nil, err
		}
		if len(ids) == 0 {
			return nil, nil
		}
	}
	return audit.Containers(ctx, cli, opts, ids...)
}

func auditRecord(ctx context.Context, storeURL, path string) ([]audit.Report, error) {
	raw, err := readRecord(ctx, storeURL, path)
	if err != nil {
		return nil, err
	}
	rec, err := audit.ParseRecord(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return []audit.Report{rec.Recheck()}, nil
}

// readRecord reads a record from a local file, or from a blob store key.
func readRecord(ctx context.Context, storeURL, key string) ([]byte, error) {
	if storeURL == "" {
		raw, err := os.ReadFile(key)
		if err != nil {
			return nil, fmt.Errorf("read record %s (give the local path of audit.json, or its key with --store): %w", key, err)
		}
		return raw, nil
	}
	store, err := persist.Open(ctx, storeURL)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	rc, err := store.Open(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read record %s from %s: %w", key, storeURL, err)
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func writeAuditReports(w io.Writer, reports []audit.Report, asJSON bool) error {
	if asJSON {
		if reports == nil {
			reports = []audit.Report{}
		}
		return audit.WriteJSON(w, reports)
	}
	if len(reports) == 0 {
		_, err := fmt.Fprintf(w, "no containers labelled %s=true\n", sandbox.LabelManaged)
		return err
	}
	for _, r := range reports {
		if err := r.WriteTable(w); err != nil {
			return err
		}
	}
	return nil
}
