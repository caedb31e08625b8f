package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// Status is the outcome of one rule.
type Status string

// Rule outcomes. NotApplicable is never counted as a pass: it means the rule
// could not be evaluated on this host or was not requested.
const (
	Pass          Status = "PASS"
	Fail          Status = "FAIL"
	NotApplicable Status = "NOT_APPLICABLE"
)

// Rule sources.
const (
	SourceCIS     = "CIS 1.6.0 §5"
	SourcePSS     = "PSS restricted"
	SourceTaskrun = "taskrun"
)

// Finding is the outcome of one rule for one container.
type Finding struct {
	// ID names the rule: a CIS number ("5.4"), "PSS:<control>" or "TR:<name>".
	ID string `json:"id"`
	// Source is the benchmark the rule comes from.
	Source string `json:"source"`
	// Title says what the rule requires.
	Title string `json:"title"`
	// Status is PASS, FAIL or NOT_APPLICABLE.
	Status Status `json:"status"`
	// Reason explains the status with the values that were read.
	Reason string `json:"reason"`
	// Gap is true for a NOT_APPLICABLE finding the backend declared as a
	// protection it does not enforce (sandbox.Gap).
	Gap bool `json:"gap,omitempty"`
}

// Report is the audit of one container: one Finding per rule, in rule order.
type Report struct {
	ContainerID string    `json:"container_id"`
	Name        string    `json:"name,omitempty"`
	Findings    []Finding `json:"findings"`
}

// Failed reports whether any rule failed.
func (r Report) Failed() bool {
	return len(r.FailedIDs()) > 0
}

// FailedIDs lists the IDs of the failed rules in rule order.
func (r Report) FailedIDs() []string {
	var ids []string
	for _, f := range r.Findings {
		if f.Status == Fail {
			ids = append(ids, f.ID)
		}
	}
	return ids
}

// Counts returns how many rules passed, failed and were not applicable.
func (r Report) Counts() (pass, fail, na int) { return Tally(r.Findings) }

// Tally counts findings as every view of a run counts them: passed, failed,
// and not applicable (any other status).
func Tally(findings []Finding) (pass, fail, na int) {
	for _, f := range findings {
		switch f.Status {
		case Pass:
			pass++
		case Fail:
			fail++
		default:
			na++
		}
	}
	return pass, fail, na
}

// TallyLine is Tally as the one line `taskrun audit`, `taskrun inspect` and
// the run index show: "N passed, N failed, N not applicable".
func TallyLine(findings []Finding) string {
	pass, fail, na := Tally(findings)
	return fmt.Sprintf("%d passed, %d failed, %d not applicable", pass, fail, na)
}

// WriteTable renders the report as an aligned text table (rule, source,
// status, why) followed by a one-line summary.
func (r Report) WriteTable(w io.Writer) error {
	name := r.ContainerID
	if r.Name != "" {
		name = fmt.Sprintf("%s (%s)", r.Name, shortID(r.ContainerID))
	}
	if _, err := fmt.Fprintf(w, "container %s\n", name); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tSOURCE\tSTATUS\tWHY")
	for _, f := range r.Findings {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s: %s\n", f.ID, f.Source, f.Status, f.Title, f.Reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%s\n\n", TallyLine(r.Findings))
	return err
}

// WriteJSON renders reports as one indented JSON array.
func WriteJSON(w io.Writer, reports []Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(reports)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
