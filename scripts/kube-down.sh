#!/usr/bin/env bash
# Stops the test cluster scripts/kube-up.sh started and removes every trace of
# it: its pods, the processes it started (by the PIDs it recorded), the mounts
# under its state directory (the kubelet's root directory among them), its CNI
# bridge, its cgroups, the host sysctls the kubelet changed (put back), and the
# state directory itself.
#
#   scripts/kube-down.sh                 stop the cluster, whoever holds it
#   scripts/kube-down.sh --release PID   drop PID's hold (kube-up.sh --hold PID);
#                                        stop the cluster only when no live
#                                        holder is left
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/kube/lib.sh
. scripts/kube/lib.sh

release=""
case ${1:-} in
"") ;;
--release)
	[ $# -eq 2 ] || die "usage: $0 --release PID"
	release=pid-$2
	;;
*) die "usage: $0 [--release PID]" ;;
esac

[ -e "$STATE" ] || exit 0
[ "$(id -u)" = 0 ] || die "stopping the test cluster needs root: run as root"

exec 8>"$LOCK"
flock 8

if [ -n "$release" ]; then
	rm -f "$HOLDS/$release"
	for h in "$HOLDS"/pid-*; do
		[ -e "$h" ] || continue
		[ -d "/proc/${h##*/pid-}" ] || rm -f "$h"
	done
	if [ -n "$(ls -A "$HOLDS" 2>/dev/null)" ]; then
		say "still held by: $(ls "$HOLDS" | tr '\n' ' ')"
		exit 0
	fi
fi

KUBE_BIN=$(dirname "$(head -n1 "$STATE/kube-bin" 2>/dev/null || echo /nonexistent/x)")

# stop NAME [SECONDS]: SIGTERM to the recorded process, SIGKILL after
# SECONDS (default 10).
stop() {
	local pid i
	pid=$(pid_of "$1") || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < ${2:-10} * 4; i++)); do
		[ -d "/proc/$pid" ] || return 0
		sleep 0.25
	done
	[ "$1" = kube-apiserver ] || say "$1 ($pid) ignored SIGTERM: killing it"
	kill -KILL "$pid" 2>/dev/null || true
	for ((i = 0; i < 40; i++)); do
		[ -d "/proc/$pid" ] || return 0
		sleep 0.25
	done
}

tasks() { ctr_ tasks ls -q 2>/dev/null; }

# 1. Pods first, while the kubelet can still stop them through the runtime
#    (network teardown included).
if pid_of kube-apiserver >/dev/null && pid_of kubelet >/dev/null; then
	kubectl_ delete pods --all --all-namespaces --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 || true
	for ((i = 0; i < 60; i++)); do
		[ -z "$(tasks)" ] && break
		sleep 0.5
	done
fi
stop kubelet

# 2. Whatever still runs in the cluster's containerd.
if pid_of containerd >/dev/null; then
	for t in $(tasks); do ctr_ tasks kill --signal SIGKILL "$t" >/dev/null 2>&1 || true; done
	for ((i = 0; i < 20; i++)); do
		[ -z "$(tasks)" ] && break
		for t in $(tasks); do ctr_ tasks delete "$t" >/dev/null 2>&1 || true; done
		sleep 0.25
	done
	for c in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$c" >/dev/null 2>&1 || true; done
fi

# 3. The control plane and the runtime, by the PIDs kube-up recorded.
for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
	case ${COMPONENTS[i]} in
	kubelet) ;;
	# It drains its watches for a long while; nothing needs them any more.
	kube-apiserver) stop kube-apiserver 2 ;;
	*) stop "${COMPONENTS[i]}" ;;
	esac
done
# Shims of this containerd (found by its socket, which only they name).
for p in /proc/[0-9]*; do
	cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
	case $cmd in
	*containerd-shim*"-address $CTRD_SOCK "*) kill -KILL "${p#/proc/}" 2>/dev/null || true ;;
	esac
done

# 4. Mounts under the state directory, deepest first (the kubelet's root
#    directory is bind-mounted onto itself; pod volumes, shm and netns are
#    under it or under containerd's state).
unmount_all() {
	local m left=0
	while read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || left=1
	done < <(awk -v s="$STATE" '{p=$5; gsub(/\\040/," ",p); if (p==s || index(p, s"/")==1) print length(p), p}' /proc/self/mountinfo |
		sort -rn | cut -d' ' -f2-)
	return $left
}
unmount_all || unmount_all || say "warning: could not unmount everything under $STATE: see mount | grep $STATE"

# 5. The bridge, the pods' cgroups, the sysctls, the log links.
ip link delete "$BRIDGE" 2>/dev/null || true
for h in /sys/fs/cgroup/*/; do
	[ -d "$h$CGROUP_ROOT" ] && find "$h$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null || true
done
if [ -f "$STATE/sysctls.saved" ]; then
	while IFS='=' read -r k v; do
		[ -n "$k" ] && sysctl -qw "$k=$v" 2>/dev/null || true
	done <"$STATE/sysctls.saved"
fi
# The chain confining the pods, and the rules jumping to it.
while read -r jump; do
	# shellcheck disable=SC2086 # the rule's words
	while iptables -w -D $jump 2>/dev/null; do :; done
done < <(pod_chain_jumps)
iptables -w -F "$POD_CHAIN" 2>/dev/null || true
iptables -w -X "$POD_CHAIN" 2>/dev/null || true
# The iptables chains the kubelet made (those absent before it started), and
# the rules jumping to them.
if [ -f "$STATE/iptables.before" ]; then
	# grep finds nothing (exit 1) once the chains are gone: not an error.
	iptables_kube_chains | { grep -vxFf "$STATE/iptables.before" || true; } | while read -r cmd t chain; do
		"$cmd" -w -t "$t" -S | awk -v ch="$chain" '$1=="-A" && $2!=ch && / -j / { for (i=1;i<=NF;i++) if ($i=="-j" && $(i+1)==ch) { sub(/^-A/, "-D"); print; break } }' |
			while read -r rule; do eval "\"\$cmd\" -w -t \"\$t\" $rule" || true; done
		"$cmd" -w -t "$t" -F "$chain" 2>/dev/null || true
		"$cmd" -w -t "$t" -X "$chain" 2>/dev/null || say "warning: could not delete $cmd -t $t chain $chain"
	done
fi
if [ -f "$STATE/host-dirs.created" ]; then
	while read -r d; do
		case $d in /var/lib/kubelet | /var/lib/cni) rm -rf "$d" ;; esac
	done <"$STATE/host-dirs.created"
fi
for l in /var/log/containers/*.log; do
	[ -L "$l" ] || continue
	case $(readlink "$l") in "$STATE"/*) rm -f "$l" ;; esac
done

# 6. The state directory.
if ! rm -rf "$STATE" 2>/dev/null; then
	unmount_all || true
	rm -rf "$STATE"
fi
say "down"
