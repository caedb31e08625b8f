package audit

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/taskrun/taskrun/probe"
)

// RecordVersion is the version of the Record format.
const RecordVersion = 1

// Record is a run's isolation record (audit.json, stored next to the run's
// blobs): how the container was confined as seen from the host (Posture,
// Findings) and from the inside (Probe), so a security team can re-check it
// later with `taskrun audit --record`.
type Record struct {
	Version int    `json:"version"`
	RunID   string `json:"run_id"`
	// ParentRunID names the run this run was forked from, if it was.
	ParentRunID string `json:"parent_run_id,omitempty"`
	ContainerID string `json:"container_id"`
	// ImageDigest is the image the container ran: its repo digest
	// (name@sha256:...) when the image came from a registry, else its image
	// ID (sha256:..., as Posture.Image).
	ImageDigest string `json:"image_digest"`
	// Runtime is the OCI runtime ("runc", "runsc", ...).
	Runtime string    `json:"runtime"`
	Host    HostFacts `json:"host"`
	Options Options   `json:"options"`
	Posture Posture   `json:"posture"`
	// Probe is the in-sandbox report, nil when the probe did not run.
	Probe *probe.Report `json:"probe,omitempty"`
	// ProbeContradictions are what the probe found against its expectation.
	ProbeContradictions []string `json:"probe_contradictions,omitempty"`
	// Egress is the run's egress policy and its proxy's totals; nil when
	// the run had no policy (no proxy, no route out).
	Egress *EgressRecord `json:"egress,omitempty"`
	// Backend is the kind of sandbox backend that ran the container
	// ("docker", "kubernetes").
	Backend  string    `json:"backend"`
	Findings []Finding `json:"findings"`
	// Gaps are the findings the backend declared it cannot enforce: the
	// protections this run did not have, each named by its rule.
	Gaps      []Finding `json:"gaps,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// NewRecord checks p and builds the run's isolation record. probeReport and
// contradictions may be nil. The record stores opts with every default filled
// in, so it names the seccomp profile the run was checked against.
func NewRecord(runID string, p Posture, host HostFacts, opts Options, probeReport *probe.Report, contradictions []string, now time.Time) Record {
	findings := Check(p, host, opts).Findings
	return Record{
		Version:             RecordVersion,
		Backend:             p.Kind(),
		Gaps:                GapsOf(findings),
		RunID:               runID,
		ContainerID:         p.ID,
		ImageDigest:         p.Image,
		Runtime:             p.Runtime,
		Host:                host,
		Options:             opts.withDefaults(),
		Posture:             p,
		Probe:               probeReport,
		ProbeContradictions: contradictions,
		Findings:            findings,
		CreatedAt:           now.UTC(),
	}
}

// Recheck evaluates the stored posture again with today's rules and the
// record's host facts and options. A record whose probe reported
// contradictions gets a failing TR:probe finding.
func (r Record) Recheck() Report {
	rep := Check(r.Posture, r.Host, r.Options)
	rep.Findings = append(rep.Findings, r.probeFinding())
	return rep
}

// Report is the run's verdict as recorded: the stored findings, then the
// self-check's (TR:probe), in the order Recheck returns them. It is what
// every view of a run counts: the run index's verdict (taskrun inspect, the
// web interface's header), the web interface's table and taskrun audit
// --record (which re-judge the facts with today's rules, as Recheck) agree
// with it while the rules are unchanged.
func (r Record) Report() Report {
	findings := append(slices.Clone(r.Findings), r.probeFinding())
	return Report{ContainerID: r.ContainerID, Findings: findings}
}

// Verdict is the one-line isolation verdict of the run index: Report's
// tally (TallyLine), and what the self-check said.
func (r Record) Verdict() string {
	if len(r.ProbeContradictions) > 0 {
		return fmt.Sprintf("refused: the self-check contradicts the host (%d contradictions)", len(r.ProbeContradictions))
	}
	rep := r.Report()
	tally := TallyLine(rep.Findings)
	switch {
	case rep.Failed():
		return tally
	case r.Probe == nil:
		return tally + " (no in-sandbox self-check)"
	}
	return tally + "; the self-check agrees"
}

func (r Record) probeFinding() Finding {
	f := Finding{ID: "TR:probe", Source: SourceTaskrun, Title: "in-sandbox self-check agreed with the expectation"}
	switch {
	case r.Probe == nil:
		f.Status, f.Reason = NotApplicable, "no probe report recorded"
	case len(r.ProbeContradictions) > 0:
		f.Status, f.Reason = Fail, fmt.Sprintf("probe contradictions: %v", r.ProbeContradictions)
	default:
		f.Status, f.Reason = Pass, fmt.Sprintf("probe uid %d, CapEff %#x, seccomp %d, pids.max %d", r.Probe.UID, r.Probe.CapEff, r.Probe.Seccomp, r.Probe.PidsMax)
	}
	return f
}

// ParseRecord decodes a stored record.
func ParseRecord(raw []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(raw, &r); err != nil {
		return Record{}, fmt.Errorf("parse isolation record: %w", err)
	}
	if r.Version != RecordVersion {
		return Record{}, fmt.Errorf("isolation record version %d; this taskrun reads version %d", r.Version, RecordVersion)
	}
	return r, nil
}
