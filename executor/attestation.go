package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/persist"
)

// attestation stores the run's attestation (attest.ObjectName): an in-toto
// Statement over every object stored so far, with what the executor knows
// of the run as its predicate, signed with Config.AttestKey or left
// unsigned without one. It runs last (filesHook.seal), so that its
// subjects are the run's objects.
func (h *filesHook) attestation(ctx context.Context, objects []persist.ObjectInfo, ex execution, v verdict) error {
	if len(objects) == 0 {
		// Nothing was stored (a fenced store dropped every write: the
		// run's lease is lost): there is nothing to attest.
		return nil
	}
	subjects := make([]attest.Subject, 0, len(objects))
	for _, o := range objects {
		subjects = append(subjects, attest.Subject{Name: o.Key, SHA256: o.SHA256})
	}
	p := h.p
	env, err := attest.Sign(ctx, p.in.AttestKey, subjects, predicate(p, h.wd, ex, v))
	if err != nil {
		return err
	}
	if p.in.AttestKey == nil {
		p.log.Warn("the run's attestation is unsigned: the host has no signing key (--attest-key)")
	}
	return h.stored(p.in.Persist.PutRunFile(ctx, p.ref, attest.ObjectName, bytes.NewReader(env), "application/json"))
}

// predicate is the run's attest.Predicate.
func predicate(p *plan, wd *workdir, ex execution, v verdict) attest.Predicate {
	pred := attest.Predicate{
		Run: attest.RunIdentity{
			UserID: p.ref.UserID, ConversationID: p.ref.ConversationID, TaskID: p.ref.TaskID, RunID: p.ref.RunID,
			SessionID: p.in.SessionID, ParentRunID: parentRun(p.in.Run),
		},
		Image:   attest.Image{Ref: p.spec.Image, Digest: ex.ImageDigest},
		Runtime: ex.Runtime,
		Backend: p.caps.Kind,
		Outcome: attest.Outcome{
			Status: string(v.status), Reason: v.reason, ExitCode: ex.Exit.ExitCode,
			TimedOut: ex.Exit.TimedOut, OOMKilled: ex.Exit.OOMKilled, Cancelled: ex.Exit.Cancelled,
		},
		Timings:  attest.Timings{StartedAt: wd.started.UTC(), EndedAt: v.ended.UTC()},
		Executor: attest.Executor{Version: p.in.Version, Instance: p.in.Executor.ID},
	}
	if pred.Runtime == "" {
		pred.Runtime = p.policy.Runtime
	}
	if ex.PromptTokens != nil || ex.CompletionTokens != nil {
		pred.Model = &attest.ModelUsage{PromptTokens: ex.PromptTokens, CompletionTokens: ex.CompletionTokens}
	}
	if ex.Usage != nil {
		pred.Usage, _ = json.Marshal(ex.Usage)
	}
	pred.Executor.Hostname, _ = os.Hostname()
	pred.Policy, _ = json.Marshal(p.policy)
	if spans := p.timings.Spans(); len(spans) > 0 {
		pred.Timings.Phases, _ = json.Marshal(spans)
	}
	rec := keptIsolation(p, ex)
	if rec != nil && rec.Version != 0 {
		pred.Backend = rec.Backend
		pred.Isolation = isolationSummary(*rec)
		pred.Host, _ = json.Marshal(rec.Host)
		if rec.Egress != nil {
			pred.Egress, _ = json.Marshal(rec.Egress)
		}
	}
	return pred
}

// keptIsolation is the run's isolation record: the one the run made, or
// for a persist retry, its kept copy; nil when there is none.
func keptIsolation(p *plan, ex execution) *audit.Record {
	if ex.isolation != nil {
		return ex.isolation
	}
	data, err := os.ReadFile(filepath.Join(p.hostDir, AuditRecordName))
	if err != nil {
		return nil
	}
	var rec audit.Record
	if json.Unmarshal(data, &rec) != nil {
		return nil
	}
	return &rec
}

// isolationSummary is the verdicts of an isolation record.
func isolationSummary(rec audit.Record) *attest.Isolation {
	iso := &attest.Isolation{RecordVersion: rec.Version, Audit: "pass", SelfCheck: "pass", Contradictions: rec.ProbeContradictions}
	for _, f := range rec.Findings {
		if f.Status == audit.Fail {
			iso.Audit = "fail"
			iso.Failed = append(iso.Failed, f.ID)
		}
	}
	for _, g := range rec.Gaps {
		iso.Gaps = append(iso.Gaps, g.ID)
	}
	switch {
	case len(rec.ProbeContradictions) > 0:
		iso.SelfCheck = "refused"
	case rec.Probe == nil:
		iso.SelfCheck = "not-run"
	}
	iso.Posture, _ = json.Marshal(rec.Posture)
	return iso
}
