package model

// The run contract inside the container (see docs/architecture.md): where the
// run directory, HOME and the executor's helpers appear, whatever the image.
const (
	// ContainerRunDir is where the run directory is bind-mounted.
	ContainerRunDir = "/taskrun"
	// ContainerHomeDir is HOME and the working directory: the workspace.
	ContainerHomeDir = ContainerRunDir + "/home"
	// ContainerHelpersDir is where the executor's read-only helper binaries
	// (the self-check, the relay) are bind-mounted, file by file.
	ContainerHelpersDir = "/.taskrun/bin"
	// PromptFileName is the prompt's file name in the run directory.
	PromptFileName = "prompt.txt"
)

// GatewaySocketPath is the model gateway's unix socket, relative to the run
// directory: the executor listens on it on the host, the agent finds it at
// ContainerRunDir/GatewaySocketPath.
const GatewaySocketPath = ".gateway/model.sock"

// HoldSocketPath is the self-check's hold socket, relative to the run
// directory: the executor listens on it on the host until its live audit of
// the container passed, and the self-check waits on it, at
// ContainerRunDir/HoldSocketPath, before the agent starts.
const HoldSocketPath = ".hold/audit.sock"
