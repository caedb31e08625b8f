package docker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"

	"github.com/taskrun/taskrun/sandbox"
)

// DefaultReapGrace spares containers and networks younger than this: a run
// being started by another executor may not be registered anywhere yet.
const DefaultReapGrace = time.Minute

// ReapGone implements sandbox.Orphans: it reaps, after DefaultReapGrace,
// the containers of the executors gone proves gone, sparing spare.
func (b *Backend) ReapGone(ctx context.Context, gone func(executorID, process string) (bool, string), spare []string) (int, error) {
	rep, err := b.Reap(ctx, ReapOptions{Grace: DefaultReapGrace, ExecutorGone: gone, Spare: spare})
	return len(rep.Removed), err
}

// ReapOptions narrows and tunes a Reap.
type ReapOptions struct {
	// Labels restricts the reaper to objects that also carry all of these
	// labels (tests use this to touch only their own containers).
	Labels map[string]string
	// Grace spares objects created less than Grace ago; 0 means DefaultReapGrace.
	Grace time.Duration
	// DryRun reports what would be removed without removing anything.
	DryRun bool
	// All applies the rules below to every managed container on the host,
	// whoever created it (`taskrun gc --all`). By default Reap removes only
	// containers of this backend's instance (WithInstance) and of executors
	// that ExecutorGone proves gone; containers of live executors, and
	// containers without an instance label, are left alone.
	All bool
	// ExecutorGone reports whether the executor instance id, whose process
	// record (sandbox.LabelInstanceProcess) is process ("" when the
	// container has none), is provably gone (see package instance), and
	// why. Nil proves no executor gone.
	ExecutorGone func(id, process string) (gone bool, why string)
	// Spare lists container IDs never to remove: a recovery still needs
	// them (their logs were not saved yet).
	Spare []string
}

// ReapedContainer is a container Reap removed (or would remove in a dry run).
type ReapedContainer struct {
	// ID is the container ID.
	ID string `json:"id"`
	// RunID is the dev.taskrun.run label.
	RunID string `json:"run_id,omitempty"`
	// State is the engine's state when found ("running", "exited", ...).
	State string `json:"state"`
	// Reason says why no live run owns it.
	Reason string `json:"reason"`
}

// ReapReport says what a Reap found.
type ReapReport struct {
	// Removed lists the containers removed, or that would be in a dry run.
	Removed []ReapedContainer `json:"removed"`
	// Spared counts managed containers left alone because a live run owns them
	// or they are within the grace period.
	Spared int `json:"spared"`
	// Networks lists the IDs of dangling managed networks removed (or that
	// would be in a dry run).
	Networks []string `json:"networks,omitempty"`
}

// Reap removes managed containers that no live run owns, and dangling managed
// networks. Which containers it considers is set by opts (All, and by default
// this instance's and gone executors'): a container of an executor proven
// gone is removed whatever its state. Otherwise a container is owned by a
// live run when this Backend holds a handle for it, or when it is running and
// not past its dev.taskrun.expires time. Objects younger than the grace
// period, and exited containers that finished within it, are spared. Removal
// errors are joined and returned next to the report.
func (b *Backend) Reap(ctx context.Context, opts ReapOptions) (ReapReport, error) {
	if opts.Grace <= 0 {
		opts.Grace = DefaultReapGrace
	}
	var rep ReapReport
	cs, err := b.api.ContainerList(ctx, container.ListOptions{All: true, Filters: managedFilter(opts.Labels)})
	if err != nil {
		return rep, fmt.Errorf("reap: list containers: %w", err)
	}
	now := b.now()
	var errs []error
	for _, c := range cs {
		reason := b.reapReason(ctx, c, opts, now)
		if reason == "" {
			rep.Spared++
			continue
		}
		rep.Removed = append(rep.Removed, ReapedContainer{ID: c.ID, RunID: c.Labels[sandbox.LabelRun], State: c.State, Reason: reason})
		if opts.DryRun {
			continue
		}
		b.log.InfoContext(ctx, "reaping container", "container", shortID(c.ID), "run", c.Labels[sandbox.LabelRun], "reason", reason)
		errs = append(errs, b.removeContainer(ctx, c.ID))
	}
	nets, err := b.reapNetworks(ctx, opts, now)
	rep.Networks = nets
	errs = append(errs, err)
	return rep, errors.Join(errs...)
}

// reapReason says why c is to be removed, or "" to spare it.
func (b *Backend) reapReason(ctx context.Context, c container.Summary, opts ReapOptions, now time.Time) string {
	if b.isLive(c.ID) || slices.Contains(opts.Spare, c.ID) {
		return ""
	}
	owner := c.Labels[sandbox.LabelInstance]
	mine := owner != "" && owner == b.instance
	if !mine && owner != "" && opts.ExecutorGone != nil {
		if gone, why := opts.ExecutorGone(owner, c.Labels[sandbox.LabelInstanceProcess]); gone {
			return "its executor is gone: " + why
		}
	}
	if !mine && !opts.All {
		return "" // a live (or unknown) executor's: not ours to judge
	}
	return b.orphanReason(c, b.finishedAt(ctx, c), now, opts.Grace)
}

// finishedAt is when an exited container stopped, or the zero time when it
// has not run or cannot be inspected.
func (b *Backend) finishedAt(ctx context.Context, c container.Summary) time.Time {
	if c.State != container.StateExited && c.State != container.StateDead {
		return time.Time{}
	}
	insp, _, err := b.api.ContainerInspectWithRaw(ctx, c.ID, false)
	if err != nil || insp.State == nil {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, insp.State.FinishedAt)
	if err != nil {
		return time.Time{}
	}
	return t
}

// orphanReason says why no live run owns c, or "" when one does or c is
// within the grace period. An exited container is spared for the grace
// period after it finished too: its run may belong to another executor that
// is still collecting its exit status.
func (b *Backend) orphanReason(c container.Summary, finished, now time.Time, grace time.Duration) string {
	if b.isLive(c.ID) {
		return ""
	}
	if !finished.IsZero() && now.Sub(finished) < grace {
		return ""
	}
	created, ok := labelTime(c.Labels, sandbox.LabelCreated)
	if !ok {
		created = time.Unix(c.Created, 0)
	}
	if now.Sub(created) < grace {
		return ""
	}
	if c.State != container.StateRunning {
		return "not running and no handle in this executor"
	}
	expires, ok := labelTime(c.Labels, sandbox.LabelExpires)
	if !ok || now.Before(expires) {
		return ""
	}
	return "running past its expiry " + expires.Format(time.RFC3339)
}

// reapNetworks removes dangling managed networks older than the grace period.
func (b *Backend) reapNetworks(ctx context.Context, opts ReapOptions, now time.Time) ([]string, error) {
	f := managedFilter(opts.Labels)
	f.Add("dangling", "true")
	nets, err := b.api.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return nil, fmt.Errorf("reap: list networks: %w", err)
	}
	var removed []string
	var errs []error
	for _, n := range nets {
		if now.Sub(n.Created) < opts.Grace {
			continue
		}
		removed = append(removed, n.ID)
		if opts.DryRun {
			continue
		}
		if err := b.api.NetworkRemove(ctx, n.ID); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("reap: remove network %s: %w", n.Name, err))
		}
	}
	return removed, errors.Join(errs...)
}

// managedFilter selects objects labelled managed plus every extra label.
func managedFilter(extra map[string]string) filters.Args {
	f := filters.NewArgs(filters.Arg("label", sandbox.LabelManaged+"=true"))
	for k, v := range extra {
		f.Add("label", k+"="+v)
	}
	return f
}

// labelTime parses an RFC 3339 label.
func labelTime(labels map[string]string, key string) (time.Time, bool) {
	v, ok := labels[key]
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, v)
	return t, err == nil
}
