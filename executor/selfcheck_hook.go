package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/helpers"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/probe"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/timings"
)

// selfCheckHook is the run's isolation checks: the in-sandbox self-check,
// the live audit from the host, and the isolation record of what they
// found.
//
//	Configure  the self-check wraps the container's command (its helper
//	           files mounted read-only), holding the agent for the host's
//	           go-ahead where the container shares the run directory
//	Prestart   the hold listens in the run directory; the container's
//	           stderr is filtered for the self-check's report
//	Poststart  (gate) the live audit of the started container; the
//	           go-ahead once it passed, else the container is stopped
//	Exited     the hold closes; the self-check's report is read, and the
//	           isolation record made
//	Collect    the isolation record (audit.json) is stored, from the local
//	           copy the runner kept (also a kept run's)
//
// Without helpers there is no self-check: the live audit still runs.
type selfCheckHook struct {
	p   *plan
	wd  *workdir
	iso *isolation
	// gated is set once the gate ran: the container started.
	gated bool
}

func (h *selfCheckHook) name() string { return "isolation" }

// configure plans the checks of the container under its policy and puts
// the self-check in front of whatever else wraps the command.
func (h *selfCheckHook) configure(req *configureRequest) {
	p := h.p
	iso := h.isolation()
	if len(p.helpers) == 0 {
		return
	}
	expect, _ := json.Marshal(iso.expect) // an Expectation always marshals
	wrapper := []string{helpers.ProbePath, "--nonce", iso.nonce, "--expect", string(expect)}
	if iso.holds {
		wrapper = append(wrapper, probe.HoldFlag, model.ContainerRunDir+"/"+model.HoldSocketPath)
	}
	req.Spec.Mounts = append(req.Spec.Mounts, p.helpers.Mounts()...)
	req.Spec.Wrapper = append(append(wrapper, "--"), req.Spec.Wrapper...)
}

// isolation is the run's checks, planned once under the run's policy (its
// user is known once the uid hook ran): the container's wrapper, the hold
// and the stderr filter share its nonce, whichever of configure (at the
// create point) and prestart comes first.
func (h *selfCheckHook) isolation() *isolation {
	if h.iso == nil {
		h.iso = newIsolation(h.p, h.wd.policy(h.p), h.p.caps)
	}
	return h.iso
}

// prestart opens the hold, once the run directory exists, and has the
// runner filter the container's stderr for the self-check's report.
func (h *selfCheckHook) prestart(_ context.Context, req *prestartRequest, resp *prestartResponse) error {
	if len(h.p.helpers) == 0 {
		return nil
	}
	iso := h.isolation()
	if err := iso.listenHold(h.p, req.Owner.UID); err != nil {
		return fmt.Errorf("self-check: %w", err)
	}
	resp.StderrFilter = iso.intercept
	return nil
}

// gate audits the live container and lets the agent go once it passed; a
// container that breaks a rule is refused (its hold closed). The runner
// runs it beside the container, ending ctx once the container exited.
func (h *selfCheckHook) gate(ctx context.Context, req *gateRequest, resp *gateResponse) error {
	iso, p := h.isolation(), h.p
	h.gated = true
	err := p.timings.Time(timings.LiveAudit, func() error { return iso.auditLive(req.Run, p.caps, req.Handle, req.HostFacts) })
	if iso.posture != nil {
		resp.ImageDigest, resp.Runtime = imageDigest(p.image, iso.posture.Image), iso.posture.Runtime
		iso.imageDigest = resp.ImageDigest
	}
	if err != nil {
		iso.closeHold()
		return err
	}
	resp.GoAhead = iso.releaseHold(ctx)
	return nil
}

// exited closes the hold (a self-check that never asked refuses), reads
// the self-check's report and makes the isolation record.
func (h *selfCheckHook) exited(_ context.Context, req *exitedRequest, resp *exitedResponse) error {
	if h.iso == nil {
		return nil
	}
	h.iso.closeHold()
	if !h.gated {
		return nil // the container never started
	}
	err := h.iso.readProbe(req.Result)
	resp.Isolation = h.iso.record(h.p.ref.RunID)
	if resp.Isolation != nil {
		resp.Isolation.ParentRunID = h.p.in.Run.ParentRunID
	}
	return err
}

// collect stores the isolation record from its local copy.
func (h *selfCheckHook) collect(ctx context.Context, req *collectRequest, _ *collectResponse) error {
	return req.Kept(ctx, AuditRecordName, AuditRecordName, "application/json")
}

// record is the run's isolation record, or nil when no container was
// inspected.
func (iso *isolation) record(runID string) *audit.Record {
	if iso.posture == nil {
		return nil
	}
	rec := audit.NewRecord(runID, *iso.posture, iso.host, iso.opts, iso.probeReport, iso.contradictions, time.Now())
	if iso.imageDigest != "" {
		rec.ImageDigest = iso.imageDigest
	}
	return &rec
}

// intercept returns the stderr writer that extracts the self-check's report
// before stderr.
func (iso *isolation) intercept(stderr io.Writer) io.Writer {
	iso.interceptor = probe.NewInterceptor(stderr, iso.nonce)
	return iso.interceptor
}

// imageDigest is the digest a run's records name its image by: the repo
// digest the image was resolved to, when the container really ran that
// image (ranID, the image ID the engine reports for it), else ranID.
func imageDigest(resolved sandbox.Image, ranID string) string {
	if ranID == "" || resolved.ID == ranID {
		return resolved.Digest()
	}
	return ranID
}
