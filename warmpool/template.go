package warmpool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"time"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/probe"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workspace"
)

// Template is everything that shapes a pool container, fixed before any run
// claims it. Runs whose Templates are equal share a key and its slots; the
// executor builds a run's Template from the same plan its cold
// container would be made from, so a warm container is confined exactly as
// the cold one would be.
type Template struct {
	// Image is the run image; it must exist locally.
	Image string `json:"image"`
	// Policy confines the container. With LeaseUIDs its User is replaced by
	// each slot's own host uid.
	Policy sandbox.Policy `json:"policy"`
	// LeaseUIDs gives each slot a host uid/gid of its own from
	// Config.UIDs, held from the fill until the run that claims it ends.
	LeaseUIDs bool `json:"lease_uids,omitempty"`
	// Owner owns the slot's run directories without LeaseUIDs (the
	// policy's numeric user).
	Owner workspace.Owner `json:"owner"`
	// Mounts are the read-only helper files mounted beside the run dir.
	Mounts []sandbox.Mount `json:"mounts"`
	// Gate is the in-container path of the self-check, which parks as the
	// gate (probe.GateFlag) and later checks the sandbox for the run.
	Gate string `json:"gate"`
	// WorkingDir is the container's working directory.
	WorkingDir string `json:"working_dir"`
	// Labels are put on the container next to the dev.taskrun.* labels.
	Labels map[string]string `json:"labels,omitempty"`
	// DiskLimit caps the slot's run directory (a loop-mounted filesystem
	// made at fill time, as for a cold run); 0: no cap.
	DiskLimit int64 `json:"disk_limit"`
	// Timeout is the run's timeout, StopGrace its stop grace.
	Timeout   time.Duration `json:"timeout"`
	StopGrace time.Duration `json:"stop_grace"`
	// Expect is what the self-check must observe; with LeaseUIDs its UID is
	// set to each slot's uid.
	Expect probe.Expectation `json:"expect"`
	// Audit are the options of the live audit; RunDir is set to each slot's
	// directory.
	Audit audit.Options `json:"audit"`
}

// Key is the template's pool key: a digest of all of it.
func (t Template) Key() string {
	t.Labels = maps.Clone(t.Labels)
	t.Mounts = slices.Clone(t.Mounts)
	data, err := json.Marshal(t)
	if err != nil {
		panic("warmpool: a Template always marshals: " + err.Error())
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}
