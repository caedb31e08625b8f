# Shared settings of the test cluster scripts (kube-up.sh, kube-down.sh,
# kube-load-image.sh). Sourced, not run.
#
# Environment:
#   TASKRUN_KUBE_DIR        state directory (default /tmp/taskrun-kube): certs,
#                           etcd data, containerd, kubelet, logs, kubeconfig
#   TASKRUN_KUBE_NODE_IP    the node's address (default: eth0's IPv4 address,
#                           else the address of the default route's device)
#   TASKRUN_KUBE_POD_SUBNET pod addresses (default 10.213.0.0/24)

STATE=${TASKRUN_KUBE_DIR:-/tmp/taskrun-kube}
LOCK=$STATE.lock
KUBECONFIG_PATH=$STATE/kubeconfig
PKI=$STATE/pki
PIDS=$STATE/pids
LOGS=$STATE/logs
HOLDS=$STATE/holds
CTRD_DIR=$STATE/containerd
CTRD_SOCK=$CTRD_DIR/containerd.sock
KUBELET_ROOT=$STATE/kubelet
CNI_CONF_DIR=$STATE/cni/net.d
CNI_IPAM_DIR=$STATE/cni/ipam
CNI_BIN_DIR=${TASKRUN_KUBE_CNI_BIN_DIR:-/usr/lib/cni}
POD_SUBNET=${TASKRUN_KUBE_POD_SUBNET:-10.213.0.0/24}
SERVICE_SUBNET=10.213.128.0/24
# The bridge's name derives from the state directory, so two clusters with
# different state directories never share one.
BRIDGE=trk$(printf '%s' "$STATE" | sha256sum | cut -c1-8)
# POD_CHAIN is the iptables chain that confines the pods on $BRIDGE: they
# reach nothing on this machine and no other pod (see kube-up's network part).
POD_CHAIN=TASKRUN-$BRIDGE
# The cgroup (in every v1 hierarchy) holding the pods' cgroups.
CGROUP_ROOT=/taskrun-kube-$(printf '%s' "$STATE" | sha256sum | cut -c1-8)
NODE_NAME=taskrun-node
RUNS_NAMESPACE=taskrun-runs
PAUSE_IMAGE=taskrun.local/pause:1

ETCD_PORT=23790
ETCD_PEER_PORT=23800
APISERVER_PORT=16443
KUBELET_PORT=10350
KUBELET_HEALTHZ_PORT=10348

# Host directories the kubelet and the CNI plugins use whatever the state
# directory (the device-plugin socket, CNI's result cache): kube-down removes
# those kube-up found absent.
HOST_DIRS=(/var/lib/kubelet /var/lib/cni)

# Processes in start order; kube-down stops them in reverse.
COMPONENTS=(etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet)

# Host sysctls the kubelet sets at start; kube-up saves their values and
# kube-down restores them.
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

# iptables_kube_chains prints "COMMAND TABLE CHAIN" for each KUBE-* chain in
# the host's iptables and ip6tables (the kubelet makes a few at start).
iptables_kube_chains() {
	local cmd t
	for cmd in iptables ip6tables; do
		command -v "$cmd" >/dev/null 2>&1 || continue
		for t in filter nat mangle; do
			"$cmd" -w -t "$t" -S 2>/dev/null | awk -v c="$cmd" -v t="$t" '$1=="-N" && $2 ~ /^KUBE-/ {print c, t, $2}'
		done
	done
}

# pod_chain_jumps prints the INPUT and FORWARD rules that send the pods'
# traffic to $POD_CHAIN, as arguments after -C/-I/-D.
pod_chain_jumps() {
	printf '%s\n' "INPUT -i $BRIDGE -j $POD_CHAIN" "FORWARD -i $BRIDGE -j $POD_CHAIN"
}

say() { printf '%s: %s\n' "$(basename "$0" .sh)" "$*" >&2; }
die() {
	printf '%s: %s\n' "$(basename "$0" .sh)" "$*" >&2
	exit 1
}

node_ip() {
	if [ -n "${TASKRUN_KUBE_NODE_IP:-}" ]; then
		echo "$TASKRUN_KUBE_NODE_IP"
		return
	fi
	local dev ip
	ip=$(ip -4 -o addr show dev eth0 scope global 2>/dev/null | awk '{split($4,a,"/"); print a[1]; exit}')
	if [ -z "$ip" ]; then
		dev=$(ip -4 route show default | awk '{for(i=1;i<NF;i++) if($i=="dev"){print $(i+1); exit}}')
		[ -n "$dev" ] && ip=$(ip -4 -o addr show dev "$dev" scope global | awk '{split($4,a,"/"); print a[1]; exit}')
	fi
	[ -n "$ip" ] || die "cannot find this machine's address (no eth0, no default route): set TASKRUN_KUBE_NODE_IP"
	echo "$ip"
}

# pid_of NAME prints the PID kube-up recorded for NAME if that process still
# runs the same executable, else fails.
pid_of() {
	local f=$PIDS/$1.pid pid exe
	[ -f "$f" ] || return 1
	read -r pid exe <"$f" || return 1
	[ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
	[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ] || return 1
	echo "$pid"
}

# kubectl_ runs the kubectl kube-build made (any kubectl on PATH until then).
kubectl_() {
	local k=$KUBE_BIN/kubectl
	[ -x "$k" ] || k=kubectl
	"$k" --kubeconfig "$KUBECONFIG_PATH" "$@"
}

ctr_() { ctr --address "$CTRD_SOCK" --namespace k8s.io "$@"; }
