#!/usr/bin/env bash
# Starts a real single-node Kubernetes cluster on this machine for taskrun's
# tests, and prints the path of its admin kubeconfig. Idempotent: when the
# cluster is already up it only prints that path.
#
#   scripts/kube-up.sh               start (or find) the cluster; it stays up
#                                    until scripts/kube-down.sh
#   scripts/kube-up.sh --hold PID    the same, held for process PID only:
#                                    scripts/kube-down.sh --release PID stops it
#                                    when no other holder is left (make test)
#   scripts/kube-up.sh --check       exit 0 when the cluster is up, 1 if not
#
# The cluster: etcd (Debian etcd-server), kube-apiserver, kube-controller-manager,
# kube-scheduler and a kubelet built by scripts/kube-build.sh (cached outside the
# clone), a containerd instance of its own (own root, state and socket: Docker's
# containerd is never touched), a CNI bridge of its own, everything under the
# state directory (TASKRUN_KUBE_DIR, default /tmp/taskrun-kube; see
# scripts/kube/lib.sh). The API server listens on 127.0.0.1 only, the kubelet on
# the machine's own address. Pods run only images imported into that containerd
# (scripts/kube-load-image.sh), with imagePullPolicy Never: nothing is pulled.
#
# It also creates the namespace taskrun-runs (PodSecurity enforce=restricted),
# imports the pause image it builds and taskrun/agent:local,
# taskrun/testbox:local and taskrun/podhelper:local when Docker has them, and waits until the node is Ready
# and a restricted Pod runs. Needs root (mounts, cgroups, network devices).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
# shellcheck source=scripts/kube/lib.sh
. scripts/kube/lib.sh

GO=${GO:-go}
mode=up hold=manual
case ${1:-} in
"") ;;
--hold)
	[ $# -eq 2 ] || die "usage: $0 --hold PID"
	hold=pid-$2
	;;
--check) mode=check ;;
*) die "usage: $0 [--hold PID | --check]" ;;
esac

# cluster_up succeeds when every process runs and the API server is ready.
cluster_up() {
	local c
	[ -f "$KUBECONFIG_PATH" ] || return 1
	for c in "${COMPONENTS[@]}"; do pid_of "$c" >/dev/null || return 1; done
	kubectl_ get --raw /readyz >/dev/null 2>&1
}

if [ "$mode" = check ]; then
	KUBE_BIN=$(dirname "$(head -n1 "$STATE/kube-bin" 2>/dev/null || echo /nonexistent/x)")
	cluster_up
	exit
fi

[ "$(id -u)" = 0 ] || die "the test cluster needs root (it mounts, makes cgroups and a bridge): run as root"
for cmd in etcd containerd ctr runc openssl curl "$CNI_BIN_DIR/bridge" "$CNI_BIN_DIR/host-local" "$CNI_BIN_DIR/loopback"; do
	command -v "$cmd" >/dev/null 2>&1 ||
		die "$cmd is missing: run scripts/test-setup.sh as root (or apt-get install etcd-server containerd containernetworking-plugins openssl runc)"
done

KUBE_BIN=$(scripts/kube-build.sh)

exec 8>"$LOCK"
flock 8

add_hold() {
	mkdir -p "$HOLDS"
	: >"$HOLDS/$hold"
}

# confine_pods installs (or refreshes) the pods' network confinement. The
# bridge CNI enforces no NetworkPolicy, so the cluster does what every run
# Pod's deny-all policy asks for all the pods on its bridge: a pod reaches
# nothing on this machine (the node's address, the kubelet's port, any
# service) and no other pod, and nothing beyond; only answers to
# connections made to it pass. taskrun's self-check probes the node's
# kubelet from every run and fails a run that connects. It runs on every
# kube-up, so a cluster started before the rules existed gets them too.
confine_pods() {
	local jump
	iptables -w -N "$POD_CHAIN" 2>/dev/null || iptables -w -F "$POD_CHAIN"
	iptables -w -A "$POD_CHAIN" -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
	# REJECT, not DROP: a refused connect fails at once, so the self-check's
	# probe costs a run no timeout.
	iptables -w -A "$POD_CHAIN" -j REJECT
	while read -r jump; do
		# shellcheck disable=SC2086 # the rule's words
		iptables -w -C $jump 2>/dev/null || iptables -w -I $jump
	done < <(pod_chain_jumps)
}

if cluster_up; then
	add_hold
	confine_pods
	say "already up"
	echo "$KUBECONFIG_PATH"
	exit 0
fi
if [ -e "$STATE" ]; then
	say "found a stopped or partial cluster in $STATE: tearing it down first"
	flock -u 8
	scripts/kube-down.sh
	flock 8
fi

start_time=$(date +%s)
NODE_IP=$(node_ip)
mkdir -p "$STATE" "$PKI" "$PIDS" "$LOGS" "$CTRD_DIR" "$KUBELET_ROOT" "$CNI_CONF_DIR" "$CNI_IPAM_DIR" "$STATE/etcd" "$STATE/images"
chmod 700 "$STATE" "$STATE/etcd"
echo "$KUBE_BIN/kubectl" >"$STATE/kube-bin"

# From here on a failure shows the components' last log lines and tears
# down what was started (TASKRUN_KUBE_KEEP_ON_FAILURE=1 keeps it to look at).
fail() {
	trap - ERR
	say "$*"
	local f
	for f in "$LOGS"/*.log; do
		[ -s "$f" ] || continue
		echo "--- last lines of $f" >&2
		tail -n 15 "$f" >&2
	done
	if [ "${TASKRUN_KUBE_KEEP_ON_FAILURE:-}" = 1 ]; then
		say "kept $STATE (TASKRUN_KUBE_KEEP_ON_FAILURE=1): scripts/kube-down.sh removes it"
	else
		flock -u 8
		scripts/kube-down.sh || true
	fi
	exit 1
}
trap 'fail "failed at line $LINENO: $BASH_COMMAND"' ERR

# --- TLS: one CA for every certificate, client and serving ---------------------
cert() { # cert NAME SUBJECT [SANS]: a key and a certificate signed by the CA
	local name=$1 subj=$2 sans=${3:-} ext=$PKI/$1.ext
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		if [ -n "$sans" ]; then
			echo "extendedKeyUsage=serverAuth,clientAuth"
			echo "subjectAltName=$sans"
		else
			echo "extendedKeyUsage=clientAuth"
		fi
	} >"$ext"
	openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 30 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr" "$ext"
}
openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -subj "/CN=taskrun-test-cluster-ca" \
	-days 30 -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
	-out "$PKI/ca.crt" 2>/dev/null
cert apiserver "/CN=kube-apiserver" \
	"DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:${SERVICE_SUBNET%.*}.1"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
cert kubelet "/CN=$NODE_NAME" "DNS:$NODE_NAME,IP:$NODE_IP"
cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME"
cert admin "/O=system:masters/CN=taskrun-test-admin"
cert scheduler "/CN=system:kube-scheduler"
cert controller-manager "/CN=system:kube-controller-manager"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
chmod 600 "$PKI"/*.key

kubeconfig() { # kubeconfig FILE CERT: a kubeconfig with the certificates inlined
	local file=$1 name=$2
	cat >"$file" <<KC
apiVersion: v1
kind: Config
clusters:
- name: taskrun-test
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$name.crt")
    client-key-data: $(base64 -w0 "$PKI/$name.key")
contexts:
- name: taskrun-test
  context:
    cluster: taskrun-test
    user: $name
current-context: taskrun-test
KC
	chmod 600 "$file"
}
kubeconfig "$STATE/kubelet.kubeconfig" kubelet-client
kubeconfig "$STATE/scheduler.kubeconfig" scheduler
kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager
# The admin kubeconfig is written last (below), once the cluster answers.
kubeconfig "$STATE/admin.kubeconfig.tmp" admin

# start NAME EXECUTABLE ARGS...: runs it in its own session, logging to
# $LOGS/NAME.log, and records its PID and executable for kube-down.
start() {
	local name=$1 exe
	shift
	exe=$(readlink -f "$(command -v "$1")")
	setsid "$exe" "${@:2}" </dev/null >"$LOGS/$name.log" 2>&1 8>&- &
	echo "$! $exe" >"$PIDS/$name.pid"
}

# wait_for WHAT SECONDS COMMAND...: retries COMMAND until it succeeds.
wait_for() {
	local what=$1 secs=$2 i
	shift 2
	for ((i = 0; i < secs * 4; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.25
	done
	say "timed out after ${secs}s waiting for $what"
	return 1
}

# --- etcd ------------------------------------------------------------------------
start etcd etcd --name taskrun --data-dir "$STATE/etcd" \
	--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-cluster "taskrun=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state new \
	--log-level warn

# --- containerd (separate instance) and the CNI bridge ---------------------------
cat >"$CNI_CONF_DIR/10-taskrun.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "taskrun-kube",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$CNI_IPAM_DIR",
        "ranges": [[{"subnet": "$POD_SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
CNI
confine_pods

cat >"$CTRD_DIR/config.toml" <<TOML
version = 2
root = "$CTRD_DIR/root"
state = "$CTRD_DIR/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
]
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_DIR/containerd.ttrpc.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CTRD_DIR/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$CTRD_DIR/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$CNI_CONF_DIR"
    max_conf_num = 1
TOML
start containerd containerd --config "$CTRD_DIR/config.toml"

# --- the pause image, built here (static, FROM scratch) --------------------------
build_pause_image() {
	local dir=$STATE/images/pause layer_sha config_sha
	mkdir -p "$dir/rootfs"
	CGO_ENABLED=0 "$GO" build -trimpath -ldflags '-s -w' -o "$dir/rootfs/pause" ./internal/kubetest/pause
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir/rootfs" -cf "$dir/layer.tar" pause
	layer_sha=$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)
	cat >"$dir/config.json" <<CFG
{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:$layer_sha"]}}
CFG
	config_sha=$(sha256sum "$dir/config.json" | cut -d' ' -f1)
	mv "$dir/config.json" "$dir/$config_sha.json"
	echo "[{\"Config\":\"$config_sha.json\",\"RepoTags\":[\"$PAUSE_IMAGE\"],\"Layers\":[\"layer.tar\"]}]" >"$dir/manifest.json"
	tar -C "$dir" -cf "$STATE/images/pause.tar" manifest.json "$config_sha.json" layer.tar
	rm -rf "$dir"
}
build_pause_image

wait_for "containerd's socket" 30 ctr_ version || fail "containerd does not answer"
ctr_ images import --snapshotter native "$STATE/images/pause.tar" >/dev/null
rm -f "$STATE/images/pause.tar"

# --- kube-apiserver ----------------------------------------------------------------
etcd_ok() { [ "$(curl -fsS "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null)" != "" ]; }
wait_for etcd 30 etcd_ok || fail "etcd does not answer"
start kube-apiserver "$KUBE_BIN/kube-apiserver" \
	--etcd-servers "http://127.0.0.1:$ETCD_PORT" \
	--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
	--endpoint-reconciler-type none \
	--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
	--client-ca-file "$PKI/ca.crt" --anonymous-auth=false \
	--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
	--kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
	--kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
	--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
	--service-account-issuer https://kubernetes.default.svc \
	--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction,PodSecurity \
	--allow-privileged=true --service-cluster-ip-range "$SERVICE_SUBNET" \
	--profiling=false --cert-dir "$STATE/apiserver-certs"
mv "$STATE/admin.kubeconfig.tmp" "$KUBECONFIG_PATH"
readyz() { kubectl_ get --raw /readyz; }
wait_for "kube-apiserver" 180 readyz || fail "kube-apiserver is not ready"

# --- kube-controller-manager, kube-scheduler ---------------------------------------
start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
	--kubeconfig "$STATE/controller-manager.kubeconfig" \
	--use-service-account-credentials \
	--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
	--leader-elect=false --secure-port 0 --profiling=false
start kube-scheduler "$KUBE_BIN/kube-scheduler" \
	--kubeconfig "$STATE/scheduler.kubeconfig" --leader-elect=false --secure-port 0 --profiling=false

# --- kubelet -------------------------------------------------------------------------
# Its sysctls and iptables chains are host-wide: remember what was there, for
# kube-down to put back.
iptables_kube_chains >"$STATE/iptables.before"
for d in "${HOST_DIRS[@]}"; do [ -e "$d" ] || echo "$d"; done >"$STATE/host-dirs.created"
for s in "${KUBELET_SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s")"; done >"$STATE/sysctls.saved"
# The pods' cgroups live under a cgroup of their own in every v1 hierarchy.
for h in /sys/fs/cgroup/*/; do
	[ -d "$h" ] && [ -f "$h/cgroup.procs" ] || continue
	mkdir -p "$h$CGROUP_ROOT"
	if [ -f "$h/cpuset.cpus" ]; then
		cat "$h/cpuset.cpus" >"$h$CGROUP_ROOT/cpuset.cpus"
		cat "$h/cpuset.mems" >"$h$CGROUP_ROOT/cpuset.mems"
	fi
done
cat >"$STATE/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
containerRuntimeEndpoint: unix://$CTRD_SOCK
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
podLogsDir: $STATE/pod-logs
maxPods: 64
podPidsLimit: 1024
# Volume usage (an emptyDir's sizeLimit, the run's disk cap) is measured
# every 10 s rather than every minute, so a run past its cap is evicted
# while it still runs.
volumeStatsAggPeriod: 10s
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
containerLogMaxSize: 10Mi
serializeImagePulls: false
YAML
start kubelet "$KUBE_BIN/kubelet" --config "$STATE/kubelet.yaml" \
	--kubeconfig "$STATE/kubelet.kubeconfig" --root-dir "$KUBELET_ROOT" \
	--hostname-override "$NODE_NAME" --node-ip "$NODE_IP"

# --- images ----------------------------------------------------------------------------
for img in taskrun/agent:local taskrun/testbox:local taskrun/podhelper:local; do
	if docker image inspect "$img" >/dev/null 2>&1; then
		scripts/kube-load-image.sh "$img" >/dev/null
	fi
done

# --- the runs namespace, and a restricted Pod that runs --------------------------------
node_ready() {
	[ "$(kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
wait_for "node $NODE_NAME to be Ready" 180 node_ready || fail "node $NODE_NAME is not Ready"
kubectl_ apply -f - >/dev/null <<NS
apiVersion: v1
kind: Namespace
metadata:
  name: $RUNS_NAMESPACE
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
NS
default_sa() { kubectl_ -n "$RUNS_NAMESPACE" get serviceaccount default; }
wait_for "the default service account of $RUNS_NAMESPACE" 60 default_sa ||
	fail "kube-controller-manager did not create the default service account of $RUNS_NAMESPACE"
kubectl_ apply -f - >/dev/null <<POD
apiVersion: v1
kind: Pod
metadata:
  name: kube-up-check
  namespace: $RUNS_NAMESPACE
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  securityContext:
    runAsNonRoot: true
    runAsUser: 65535
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: pause
    image: $PAUSE_IMAGE
    imagePullPolicy: Never
    resources:
      requests: {cpu: 10m, memory: 16Mi}
      limits: {cpu: 100m, memory: 16Mi}
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
POD
check_running() {
	[ "$(kubectl_ -n "$RUNS_NAMESPACE" get pod kube-up-check -o 'jsonpath={.status.phase}')" = Running ]
}
wait_for "a restricted Pod to run" 90 check_running || {
	kubectl_ -n "$RUNS_NAMESPACE" describe pod kube-up-check >&2 || true
	fail "the restricted Pod kube-up-check does not run"
}
kubectl_ -n "$RUNS_NAMESPACE" delete pod kube-up-check --wait=true --timeout=60s >/dev/null

trap - ERR
add_hold
say "up in $(($(date +%s) - start_time))s; node $NODE_NAME ($NODE_IP); kubeconfig:"
echo "$KUBECONFIG_PATH"
