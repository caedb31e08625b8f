package model

import "errors"

// RunRef identifies one run: the tenant (user) that owns it, the conversation
// and task it belongs to, and the run itself. It places the run everywhere:
// its host directory (workspace), its keys in blob storage (persist) and its
// container's labels (sandbox).
type RunRef struct {
	UserID         string `json:"user_id"`
	ConversationID string `json:"conversation_id"`
	TaskID         string `json:"task_id"`
	RunID          string `json:"run_id"`
}

// Validate checks every ID of the reference with ValidateID; the error names
// each bad ID.
func (r RunRef) Validate() error {
	return errors.Join(
		ValidateID("user", r.UserID),
		ValidateID("conversation", r.ConversationID),
		ValidateID("task", r.TaskID),
		ValidateID("run", r.RunID),
	)
}

// WithRun returns the reference to another run of the same task, such as the
// run whose session a new run resumes.
func (r RunRef) WithRun(runID string) RunRef {
	r.RunID = runID
	return r
}
