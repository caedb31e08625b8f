// Package attest makes and checks a run's attestation: an in-toto v1
// Statement whose subjects are the SHA-256 digests of every object the run
// stored and whose predicate records how the run was isolated and how it
// ended, in a DSSE envelope signed with the host's key.
//
// The formats are the standard ones (in-toto attestation v1, DSSE), so an
// auditor can check an envelope with any DSSE verifier, such as cosign's;
// Verify also re-hashes every subject from the store. The predicate is
// described in docs/attestation.md.
package attest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	intoto "github.com/in-toto/attestation/go/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

const (
	// ObjectName is the run object holding the run's DSSE envelope, beside
	// the run's other objects.
	ObjectName = "attestation.intoto.json"
	// PayloadType is the DSSE payload type of an in-toto Statement.
	PayloadType = "application/vnd.in-toto+json"
	// PredicateType names taskrun's run predicate, version 1.
	PredicateType = "https://taskrun.dev/attestation/run/v1"
	// StatementType is the in-toto Statement version taskrun writes.
	StatementType = intoto.StatementTypeUri
)

// Subject is one stored object the statement covers: its store key and the
// hex SHA-256 of its bytes.
type Subject struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// Predicate is taskrun's run predicate (PredicateType). Every field is a
// fact the executor measured or was configured with; none comes from the
// agent.
type Predicate struct {
	// Run identifies the run; a verifier compares it with the run it was
	// asked about, so an envelope moved from another run is refused.
	Run RunIdentity `json:"run"`
	// Image is what the run asked for and what it ran.
	Image Image `json:"image"`
	// Runtime is the container runtime (runc, runsc, ...); Backend the
	// sandbox backend (docker, kubernetes).
	Runtime string `json:"runtime,omitempty"`
	Backend string `json:"backend,omitempty"`
	// Policy is the effective sandbox policy (seccomp, capabilities,
	// network, limits), as the executor applied it.
	Policy json.RawMessage `json:"policy,omitempty"`
	// Isolation summarises the isolation record (audit.json, itself a
	// subject): the live audit and the in-sandbox self-check.
	Isolation *Isolation `json:"isolation,omitempty"`
	// Egress is the egress policy in force and its totals; nil when the
	// run had no route out.
	Egress json.RawMessage `json:"egress,omitempty"`
	// Model is the gateway's metering; nil when the run used no model.
	Model *ModelUsage `json:"model,omitempty"`
	// Usage is what the run's container used (CPU time, peak memory,
	// block I/O, peak pids), as its backend sampled it; absent when it was
	// not sampled.
	Usage json.RawMessage `json:"usage,omitempty"`
	// Outcome is how the run ended, as judged before its objects were
	// stored.
	Outcome Outcome `json:"outcome"`
	// Timings are the run's phases up to the store, with when it started
	// and ended.
	Timings Timings `json:"timings"`
	// Host is what the executor read of its host (kernel, engine).
	Host json.RawMessage `json:"host,omitempty"`
	// Executor is the taskrun that ran the run and signed this.
	Executor Executor `json:"executor"`
}

// RunIdentity names a run, its tenant and, for resumes and forks, its
// parent.
type RunIdentity struct {
	UserID         string `json:"userId"`
	ConversationID string `json:"conversationId"`
	TaskID         string `json:"taskId"`
	RunID          string `json:"runId"`
	SessionID      string `json:"sessionId,omitempty"`
	ParentRunID    string `json:"parentRunId,omitempty"`
}

// Image is the run's image: the reference asked for and the digest run.
type Image struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest,omitempty"`
}

// Isolation summarises the run's isolation checks.
type Isolation struct {
	// RecordVersion is the isolation record's format version.
	RecordVersion int `json:"recordVersion,omitempty"`
	// Audit is "pass" when every live-audit rule passed or did not apply,
	// else "fail"; Failed names the failing rules and Gaps the protections
	// the backend declared it does not enforce.
	Audit  string   `json:"audit"`
	Failed []string `json:"failed,omitempty"`
	Gaps   []string `json:"gaps,omitempty"`
	// SelfCheck is "pass", "refused" (Contradictions say why) or
	// "not-run" (the run had no self-check).
	SelfCheck      string   `json:"selfCheck"`
	Contradictions []string `json:"contradictions,omitempty"`
	// Posture is the container's confinement as the engine reported it
	// (seccomp, capabilities, namespaces, mounts, limits).
	Posture json.RawMessage `json:"posture,omitempty"`
}

// ModelUsage is the token count the run's model gateway metered.
type ModelUsage struct {
	PromptTokens     *int `json:"promptTokens,omitempty"`
	CompletionTokens *int `json:"completionTokens,omitempty"`
}

// Outcome is the run's verdict and its container's exit.
type Outcome struct {
	Status    string `json:"status"`
	Reason    string `json:"reason,omitempty"`
	ExitCode  int    `json:"exitCode"`
	TimedOut  bool   `json:"timedOut,omitempty"`
	OOMKilled bool   `json:"oomKilled,omitempty"`
	Cancelled bool   `json:"cancelled,omitempty"`
}

// Timings are when the run started and ended, and its phases.
type Timings struct {
	StartedAt time.Time       `json:"startedAt,omitzero"`
	EndedAt   time.Time       `json:"endedAt,omitzero"`
	Phases    json.RawMessage `json:"phases,omitempty"`
}

// Executor is the taskrun process that ran the run.
type Executor struct {
	Version  string `json:"version,omitempty"`
	Instance string `json:"instance,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	// KeyID names the key that signed the envelope (its SSH SHA256
	// fingerprint); empty when the host has no key and the envelope is
	// unsigned.
	KeyID string `json:"keyId,omitempty"`
}

// ErrInvalidStatement marks a statement that cannot be made or read: no
// subject, a subject without a valid digest, or a payload that is not a
// taskrun run statement.
var ErrInvalidStatement = errors.New("attest: invalid statement")

// Statement returns the in-toto v1 Statement of subjects and pred, as the
// JSON bytes a DSSE envelope carries. Subjects are sorted by name; a
// repeated name is refused.
func Statement(subjects []Subject, pred Predicate) ([]byte, error) {
	subjects = slices.Clone(subjects)
	slices.SortFunc(subjects, func(a, b Subject) int { return strings.Compare(a.Name, b.Name) })
	st := &intoto.Statement{Type: StatementType, PredicateType: PredicateType}
	for i, s := range subjects {
		if i > 0 && subjects[i-1].Name == s.Name {
			return nil, fmt.Errorf("%w: subject %q appears twice", ErrInvalidStatement, s.Name)
		}
		st.Subject = append(st.Subject, &intoto.ResourceDescriptor{Name: s.Name, Digest: map[string]string{"sha256": s.SHA256}})
	}
	raw, err := json.Marshal(pred)
	if err != nil {
		return nil, fmt.Errorf("attest: encode predicate: %w", err)
	}
	st.Predicate = &structpb.Struct{}
	if err := protojson.Unmarshal(raw, st.Predicate); err != nil {
		return nil, fmt.Errorf("attest: encode predicate: %w", err)
	}
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidStatement, err)
	}
	out, err := protojson.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("attest: encode statement: %w", err)
	}
	// protojson varies its whitespace on purpose; the signed bytes are
	// compact JSON, the same for the same statement.
	var buf bytes.Buffer
	if err := json.Compact(&buf, out); err != nil {
		return nil, fmt.Errorf("attest: encode statement: %w", err)
	}
	return buf.Bytes(), nil
}

// ParseStatement reads a statement made by Statement: an in-toto v1
// Statement with taskrun's predicate type and at least one subject, each
// with a SHA-256 digest.
func ParseStatement(payload []byte) ([]Subject, Predicate, error) {
	var st intoto.Statement
	if err := protojson.Unmarshal(payload, &st); err != nil {
		return nil, Predicate{}, fmt.Errorf("%w: not an in-toto statement: %w", ErrInvalidStatement, err)
	}
	if err := st.Validate(); err != nil {
		return nil, Predicate{}, fmt.Errorf("%w: %w", ErrInvalidStatement, err)
	}
	if st.GetType() != StatementType {
		return nil, Predicate{}, fmt.Errorf("%w: statement type %q, want %q", ErrInvalidStatement, st.GetType(), StatementType)
	}
	if st.GetPredicateType() != PredicateType {
		return nil, Predicate{}, fmt.Errorf("%w: predicate type %q is not taskrun's run predicate %q", ErrInvalidStatement, st.GetPredicateType(), PredicateType)
	}
	subjects := make([]Subject, 0, len(st.GetSubject()))
	for _, rd := range st.GetSubject() {
		d := rd.GetDigest()["sha256"]
		if d == "" {
			return nil, Predicate{}, fmt.Errorf("%w: subject %q has no sha256 digest", ErrInvalidStatement, rd.GetName())
		}
		subjects = append(subjects, Subject{Name: rd.GetName(), SHA256: d})
	}
	raw, err := protojson.Marshal(st.GetPredicate())
	if err != nil {
		return nil, Predicate{}, fmt.Errorf("%w: predicate: %w", ErrInvalidStatement, err)
	}
	var pred Predicate
	if err := json.Unmarshal(raw, &pred); err != nil {
		return nil, Predicate{}, fmt.Errorf("%w: predicate: %w", ErrInvalidStatement, err)
	}
	return subjects, pred, nil
}
