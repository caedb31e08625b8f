package sandbox

// Labels a backend puts on every run container, so that audits, the reaper
// and `taskrun gc` can tell whose container it is. They are the only
// definition of the dev.taskrun.* container labels.
const (
	// LabelManaged marks a container as taskrun's; its value is "true".
	LabelManaged = "dev.taskrun.managed"
	// LabelTenant holds Spec.Run.UserID.
	LabelTenant = "dev.taskrun.tenant"
	// LabelConversation holds Spec.Run.ConversationID.
	LabelConversation = "dev.taskrun.conversation"
	// LabelTask holds Spec.Run.TaskID.
	LabelTask = "dev.taskrun.task"
	// LabelRun holds Spec.Run.RunID; the run dir's last path element equals it.
	LabelRun = "dev.taskrun.run"
	// LabelRunDir holds the absolute host path of the run dir, so audits can
	// check the bind mount's source exactly.
	LabelRunDir = "dev.taskrun.run-dir"
	// LabelCreated is the creation time (RFC 3339, UTC).
	LabelCreated = "dev.taskrun.created"
	// LabelExpires is the time (RFC 3339, UTC) after which no live run can own
	// the container: created + timeout + stop grace + slack. It is absent when
	// the Spec has no timeout.
	LabelExpires = "dev.taskrun.expires"
	// LabelInstance holds the ID of the executor instance that created the
	// container (package instance); reapers leave other live executors'
	// containers alone by it.
	LabelInstance = "dev.taskrun.instance"
	// LabelInstanceProcess holds the creating executor's process record,
	// "PID/START_TICKS/BOOT_ID" (instance.Info.Process): it proves the
	// executor gone even after a clean exit removed its lock file.
	LabelInstanceProcess = "dev.taskrun.instance-process"
	// LabelEgress marks the container of a run with an egress policy; its
	// value is the in-container path of the egress proxy's socket.
	LabelEgress = "dev.taskrun.egress"
	// LabelPool marks a container started ahead of its run by a warm pool
	// (package warmpool); its value is the pool key (a digest of everything
	// that shapes the container). Its dev.taskrun.run label is the slot's
	// ID, which is also the last element of its run dir.
	LabelPool = "dev.taskrun.pool"
)

// LabelPod holds, on Kubernetes, the name of the run's Pod, by which the
// run's NetworkPolicy selects exactly that Pod.
const LabelPod = "dev.taskrun.pod"
