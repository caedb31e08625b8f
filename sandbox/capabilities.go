package sandbox

// Capabilities is what a backend does beyond Backend, as data (as Nomad's
// drivers.Capabilities): the orchestrator branches on these fields, never
// on a backend's type or name. A backend states them with Capable;
// CapabilitiesOf reads them.
type Capabilities struct {
	// Kind names the backend: BackendDocker or BackendKubernetes.
	Kind string
	// CreatesAhead says the backend implements Creator: a container can be
	// created before the run directory is filled, and started later.
	CreatesAhead bool
	// SharesRunDir says the container bind-mounts the host's run
	// directory, so a socket the host opens there (the self-check's hold)
	// is the container's too. A Pod gets a copy, and starts without a hold.
	SharesRunDir bool
	// DescribesHost says the backend implements EngineDescriber: the live
	// audit reads the engine's host facts.
	DescribesHost bool
	// ResolvesImages says the backend implements ImageResolver;
	// ChecksImages that it implements ImageChecker.
	ResolvesImages bool
	ChecksImages   bool
	// OwnNetwork says the container always has a network interface of its
	// own, confined by the platform's policy (a Pod and its NetworkPolicy):
	// the self-check neither expects no network nor dials out.
	OwnNetwork bool
	// Unreachable are addresses the container must not connect to (its
	// node's kubelet, a peer): the self-check connects to each and fails
	// the run if one connects, rather than trusting the platform's policy.
	Unreachable []ReachTarget
	// LimitsPids says the backend enforces Policy.PidsLimit per container,
	// so the self-check expects it.
	LimitsPids bool
	// NoServiceAccount says the platform mounts no service account token
	// into the container, which the self-check verifies.
	NoServiceAccount bool
	// Stats says the backend's handles implement StatsReader: the run's
	// resource usage is sampled while its container lives.
	Stats bool
	// ListsContainers says the backend implements Orphans: it finds, stops,
	// reads and removes a container by ID after the executor that started
	// it died, and removes the containers of executors proven gone, so a
	// host recovers the runs of its dead executors on it.
	ListsContainers bool
	// Checkpoints says, by runtime (Policy.Runtime), what a checkpoint of a
	// live sandbox keeps, for a backend that implements Checkpointer; a
	// runtime not listed gets CheckpointNone (see CheckpointsFor).
	Checkpoints map[string]CheckpointKind
}

// Capable is implemented by a Backend that states its Capabilities.
type Capable interface {
	Capabilities() Capabilities
}

// CapabilitiesOf returns b's capabilities: the ones it states (Capable),
// or, for a backend that states none, a Docker-like container that shares
// the run directory and limits pids, with what its optional interfaces
// implement.
func CapabilitiesOf(b Backend) Capabilities {
	if c, ok := b.(Capable); ok {
		return c.Capabilities()
	}
	caps := Capabilities{Kind: BackendDocker, SharesRunDir: true, LimitsPids: true}
	if k, ok := b.(Kinder); ok {
		caps.Kind = k.Kind()
	}
	_, caps.CreatesAhead = b.(Creator)
	_, caps.DescribesHost = b.(EngineDescriber)
	_, caps.ResolvesImages = b.(ImageResolver)
	_, caps.ChecksImages = b.(ImageChecker)
	return caps
}

// ReachTarget is an address a sandbox must not reach (Capabilities.Unreachable).
type ReachTarget struct {
	// Name says what it is ("node kubelet").
	Name string
	// Host is the address, or HostEnv the variable of the container's
	// environment holding it (set by the backend, such as a Pod's node
	// address from the Downward API).
	Host    string
	HostEnv string
	// Port is the TCP port.
	Port int
}
