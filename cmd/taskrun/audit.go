package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/docker"
	"github.com/taskrun/taskrun/sandbox/kubernetes"
)

// Exit statuses of `taskrun audit`.
const (
	auditExitPass  = 0 // every rule passed or was not applicable
	auditExitFail  = 1 // at least one rule failed
	auditExitError = 2 // usage error, unreadable record or Docker daemon error
)

const auditHelp = `
Checks containers against CIS Docker Benchmark 1.6.0 section 5, Kubernetes Pod
Security Standards (restricted) and taskrun's own rules. Name containers, or
pass --all for every container labelled ` + sandbox.LabelManaged + `=true, or
--record to re-check a run's stored isolation record (audit.json): a local
file, or its key in --store. With --namespace NS (and --kubeconfig PATH) it
audits the runs' Pods there instead, from their spec and status. With --root, every run directory mounted into a
container must lie under it.

Exit status: 0 every rule passes, 1 a rule fails, 2 usage or daemon error.
`

// auditFlags are the parsed flags of taskrun audit.
type auditFlags struct {
	all, json, requireGVisor bool
	record, networks         string
	root, store              string
	kubeconfig, namespace    string
}

func init() {
	register(&command{
		Name:     "audit",
		Synopsis: "check containers against CIS Docker section 5 and PSS restricted",
		Args:     "CONTAINER... | --all | --record FILE",
		Help:     auditHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var f auditFlags
			f.define(fs)
			return func(ctx context.Context, a *app, args []string) int {
				if err := f.check(args); err != nil {
					return a.usageError("audit", err)
				}
				return runAudit(ctx, a, f, args)
			}
		},
	})
}

func (f *auditFlags) define(fs *pflag.FlagSet) {
	fs.BoolVar(&f.all, "all", false, "audit every container labelled "+sandbox.LabelManaged+"=true")
	fs.BoolVar(&f.json, "json", false, "print the reports as JSON")
	fs.StringVar(&f.record, "record", "", "re-check the isolation record in this local file (audit.json), or at this key of --store")
	fs.StringVar(&f.store, "store", "", storeUsage+"; with it, --record is an object key")
	fs.BoolVar(&f.requireGVisor, "require-gvisor", false, "fail containers not running under runsc")
	fs.StringVar(&f.networks, "networks", "", "comma-separated network modes to allow (default none)")
	addRootFlag(fs, &f.root, "")
	fs.StringVar(&f.namespace, "namespace", "", "audit the runs' Pods in this Kubernetes namespace (names are Pod names) instead of Docker containers")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "with --namespace: the cluster's kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
}

// check allows exactly one way of choosing what to audit.
func (f *auditFlags) check(targets []string) error {
	modes := 0
	for _, on := range []bool{f.all, f.record != "", len(targets) > 0} {
		if on {
			modes++
		}
	}
	if modes != 1 {
		return errors.New("name containers, or pass --all, or pass --record FILE (exactly one of them)")
	}
	return nil
}

// runAudit audits what f and targets select and exits 0, 1 or 2.
func runAudit(ctx context.Context, a *app, f auditFlags, targets []string) int {
	root := f.root
	if root != "" {
		abs, err := filepath.Abs(root)
		if err != nil {
			fmt.Fprintf(a.stderr, "taskrun audit: --root: %v\n", err)
			return auditExitError
		}
		root = abs
	}
	opts := audit.Options{RequireGVisor: f.requireGVisor, Mounts: audit.MountPolicy{RunsRoot: root}}
	if f.networks != "" {
		opts.AllowedNetworkModes = strings.Split(f.networks, ",")
	}
	var reports []audit.Report
	var err error
	switch {
	case f.record != "":
		reports, err = auditRecord(ctx, f.store, f.record)
	case f.namespace != "":
		reports, err = auditPods(ctx, f.kubeconfig, f.namespace, targets, opts)
	default:
		reports, err = auditLive(ctx, f.all, targets, opts)
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "taskrun audit: %v\n", err)
		return auditExitError
	}
	if err := writeAuditReports(a.stdout, reports, f.json); err != nil {
		fmt.Fprintf(a.stderr, "taskrun audit: write report: %v\n", err)
		return auditExitError
	}
	for _, r := range reports {
		if r.Failed() {
			return auditExitFail
		}
	}
	return auditExitPass
}

// auditPods audits the named Pods of namespace, or every managed one when
// names is empty, from their spec and status.
func auditPods(ctx context.Context, kubeconfig, namespace string, names []string, opts audit.Options) ([]audit.Report, error) {
	cfg, err := kubernetes.ConfigFromKubeconfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	b, err := kubernetes.New(ctx, cfg, namespace)
	if err != nil {
		return nil, err
	}
	postures, err := b.Postures(ctx, names...)
	if err != nil {
		return nil, err
	}
	host, err := b.HostFacts(ctx)
	if err != nil {
		return nil, err
	}
	reports := make([]audit.Report, 0, len(postures))
	for _, p := range postures {
		reports = append(reports, audit.Check(p, host, opts))
	}
	return reports, nil
}

// auditLive audits the given containers, or every managed one when all is
// set, through the Docker backend.
func auditLive(ctx context.Context, all bool, ids []string, opts audit.Options) ([]audit.Report, error) {
	if !all && len(ids) == 0 {
		return nil, errors.New("no containers to audit: name them, or give --all")
	}
	b, err := docker.New(ctx)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	if all {
		if ids, err = b.ManagedIDs(ctx); err != nil {
			return nil, err
		}
		if len(ids) == 0 {
			return nil, nil
		}
	}
	host, err := b.HostFacts(ctx)
	if err != nil {
		return nil, err
	}
	postures, err := b.Postures(ctx, ids...)
	if err != nil {
		return nil, err
	}
	reports := make([]audit.Report, 0, len(postures))
	for _, p := range postures {
		reports = append(reports, audit.Check(p, host, opts))
	}
	return reports, nil
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
