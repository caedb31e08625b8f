// Package runlimits holds the operator's maximum run limits and checks a
// tenant's requested limits against them. A submission's limits are a
// tenant's request; the maxima are the operator's configuration (the
// --max-run-* flags of taskrun serve and taskrun worker). A request over a
// maximum is refused, never silently granted.
package runlimits

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/taskrun/taskrun/workerclient"
)

// ErrOverMaximum is wrapped by every error about a requested limit over the
// operator's maximum.
var ErrOverMaximum = errors.New("run limit over the operator's maximum")

// Maxima are the largest limits a tenant may ask for, per run. A zero field
// takes the field of Default.
type Maxima struct {
	Timeout        time.Duration
	MemoryBytes    int64
	CPUs           float64
	PIDs           int64
	DiskBytes      int64
	MaxOutputBytes int64
}

// Default are the maxima of an operator who set none: well above the
// per-run defaults, well below what lets one run take a host.
var Default = Maxima{
	Timeout:        24 * time.Hour,
	MemoryBytes:    16 << 30,
	CPUs:           8,
	PIDs:           4096,
	DiskBytes:      64 << 30,
	MaxOutputBytes: 4 << 30,
}

// Flag names of the maxima, shared by taskrun serve and taskrun worker.
const (
	FlagTimeout   = "max-run-timeout"
	FlagMemory    = "max-run-memory"
	FlagCPUs      = "max-run-cpus"
	FlagPIDs      = "max-run-pids"
	FlagDisk      = "max-run-disk"
	FlagMaxOutput = "max-run-output"
)

// WithDefaults returns m with every zero (or negative) field taken from Default.
func (m Maxima) WithDefaults() Maxima {
	d := Default
	if m.Timeout <= 0 {
		m.Timeout = d.Timeout
	}
	if m.MemoryBytes <= 0 {
		m.MemoryBytes = d.MemoryBytes
	}
	if m.CPUs <= 0 {
		m.CPUs = d.CPUs
	}
	if m.PIDs <= 0 {
		m.PIDs = d.PIDs
	}
	if m.DiskBytes <= 0 {
		m.DiskBytes = d.DiskBytes
	}
	if m.MaxOutputBytes <= 0 {
		m.MaxOutputBytes = d.MaxOutputBytes
	}
	return m
}

// Check refuses requested limits over m (zero fields of m: Default). A zero
// requested field asks for the host's default and always passes. Every
// field over its maximum is named, with the maximum and the operator's flag.
func (m Maxima) Check(l workerclient.Limits) error {
	m = m.WithDefaults()
	var errs []error
	over := func(field string, got, max, flag string) {
		errs = append(errs, fmt.Errorf("%w: limits.%s %s is over the maximum %s: ask for at most that (the operator sets it with --%s)", ErrOverMaximum, field, got, max, flag))
	}
	if l.TimeoutMillis > m.Timeout.Milliseconds() {
		over("timeout_ms", strconv.FormatInt(l.TimeoutMillis, 10), strconv.FormatInt(m.Timeout.Milliseconds(), 10), FlagTimeout)
	}
	if l.MemoryBytes > m.MemoryBytes {
		over("memory_bytes", strconv.FormatInt(l.MemoryBytes, 10), strconv.FormatInt(m.MemoryBytes, 10), FlagMemory)
	}
	if l.CPUs > m.CPUs {
		over("cpus", strconv.FormatFloat(l.CPUs, 'g', -1, 64), strconv.FormatFloat(m.CPUs, 'g', -1, 64), FlagCPUs)
	}
	if l.PIDs > m.PIDs {
		over("pids", strconv.FormatInt(l.PIDs, 10), strconv.FormatInt(m.PIDs, 10), FlagPIDs)
	}
	if l.DiskBytes > m.DiskBytes {
		over("disk_bytes", strconv.FormatInt(l.DiskBytes, 10), strconv.FormatInt(m.DiskBytes, 10), FlagDisk)
	}
	if l.MaxOutputBytes > m.MaxOutputBytes {
		over("max_output_bytes", strconv.FormatInt(l.MaxOutputBytes, 10), strconv.FormatInt(m.MaxOutputBytes, 10), FlagMaxOutput)
	}
	return errors.Join(errs...)
}

// CheckDefaults refuses an operator's per-run default over its own
// maximum: a run that asks for nothing must be within the maxima.
func (m Maxima) CheckDefaults(d Maxima) error {
	m = m.WithDefaults()
	l := workerclient.Limits{TimeoutMillis: d.Timeout.Milliseconds(), MemoryBytes: d.MemoryBytes, CPUs: d.CPUs,
		PIDs: d.PIDs, DiskBytes: d.DiskBytes, MaxOutputBytes: d.MaxOutputBytes}
	if err := m.Check(l); err != nil {
		return fmt.Errorf("a per-run default is over its maximum: lower the default or raise the --max-run-* flag: %w", err)
	}
	return nil
}
