#!/usr/bin/env bash
# Prepares this machine for `make test` and `make bench`, idempotently: each
# step checks first and does nothing when its part is already there.
#
#   scripts/test-setup.sh               every step below, in order
#   scripts/test-setup.sh tool NAME     install one pinned Go tool if needed
#                                       and print its path (used by make vet)
#
# Steps:
#   1. a Docker engine answers (started by the caller: dockerd, CI's .ci/run);
#   2. Debian packages from DEBIAN_PACKAGES, installed with apt-get when
#      running as root;
#   3. pinned Go tools from GO_TOOLS, go-installed outside the clone;
#   4. gVisor's runsc registered with dockerd (daemon.json, then SIGHUP:
#      dockerd reloads its runtimes without restarting, containers keep running);
#   5. each executable hook in scripts/test-setup.d/, in name order, for parts
#      that need more than a package (a database cluster, a registry...).
# Each step says how long it took, in wall-clock and CPU seconds.
# The run images are built by `make images`, which `make test` runs next.
#
# In CI (CI=true) gVisor and the S3 server are required: a step that cannot
# provide them fails instead of warning.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}

# Debian packages the tests need, as "command package need" triples: the
# package is installed (as root) when the command is missing. need is
# "required" (no test run without it) or "optional" (its tests skip without
# it, except in CI). Add new needs here.
DEBIAN_PACKAGES=(
	"busybox busybox-static required" # static busybox for the image taskrun/testbox:local
	"runsc runsc optional"            # gVisor, for the --runtime runsc tests
)

# Go tools, as "name module@version" pairs, installed with go install into
# $(go env GOPATH)/bin (versitygw is found there by persist/s3test) or, for
# tools pinned per project, a versioned directory beside it.
GO_TOOLS=(
	"versitygw github.com/versity/versitygw/cmd/versitygw@v1.8.0" # real S3 server
	"staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2"       # make vet
)

# runsc's arguments when registered with dockerd: gVisor's own network stack
# stays off (Docker's --network none applies) and the host's unix sockets the
# run mounts (the model gateway) can be opened.
RUNSC_ARGS=(--network=none --host-uds=open)

say() { printf 'setup: %s\n' "$*" >&2; }
die() {
	printf 'setup: %s\n' "$*" >&2
	exit 1
}
# warn_or_die fails in CI, where every part is required, and warns elsewhere.
warn_or_die() {
	if [ "${CI:-}" = true ]; then die "$*"; fi
	say "warning: $*"
}
is_root() { [ "$(id -u)" = 0 ]; }

gopath_bin() { echo "$("$GO" env GOPATH | cut -d: -f1)/bin"; }

# tool_path NAME prints where the pinned tool NAME lives.
tool_path() {
	local name=$1 entry n mod
	for entry in "${GO_TOOLS[@]}"; do
		read -r n mod <<<"$entry"
		[ "$n" = "$name" ] || continue
		case $name in
		versitygw) echo "$(gopath_bin)/$name" ;;
		*) echo "$(gopath_bin)/taskrun-tools/$name@${mod##*@}/$name" ;;
		esac
		return 0
	done
	die "no Go tool named $name in GO_TOOLS"
}

# install_tool NAME installs NAME's pinned version unless it is there.
install_tool() {
	local name=$1 entry n mod path
	path=$(tool_path "$name")
	for entry in "${GO_TOOLS[@]}"; do
		read -r n mod <<<"$entry"
		[ "$n" = "$name" ] && break
	done
	if [ -x "$path" ]; then return 0; fi
	if [ "$name" = versitygw ] && command -v versitygw >/dev/null 2>&1; then return 0; fi
	say "installing $mod into $(dirname "$path")"
	mkdir -p "$(dirname "$path")"
	GOBIN=$(dirname "$path") "$GO" install "$mod" ||
		die "go install $mod failed: check that the Go module proxy is reachable (GOPROXY=$("$GO" env GOPROXY))"
}

step_docker() {
	command -v docker >/dev/null 2>&1 || die "the docker CLI is missing: install Docker Engine (API 1.41 or later)"
	docker info >/dev/null 2>&1 ||
		die "no Docker engine answers: start dockerd (or set DOCKER_HOST), then run make again"
}

step_packages() {
	local entry cmd pkg need missing=() required=()
	for entry in "${DEBIAN_PACKAGES[@]}"; do
		read -r cmd pkg need <<<"$entry"
		command -v "$cmd" >/dev/null 2>&1 && continue
		missing+=("$pkg")
		[ "$need" = required ] && required+=("$pkg")
	done
	[ "${#missing[@]}" -eq 0 ] && return 0
	if ! is_root || ! command -v apt-get >/dev/null 2>&1; then
		local how="run make as root on Debian or Ubuntu, or install them yourself (apt-get install ${missing[*]})"
		[ "${#required[@]}" -eq 0 ] || die "missing packages: ${missing[*]}; $how"
		warn_or_die "missing packages: ${missing[*]}; their tests will be skipped; $how"
		return 0
	fi
	say "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

step_go_tools() {
	local entry name mod
	for entry in "${GO_TOOLS[@]}"; do
		read -r name mod <<<"$entry"
		install_tool "$name"
	done
}

runsc_registered() {
	docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'
}

step_runsc() {
	runsc_registered && return 0
	local runsc
	runsc=$(command -v runsc) || {
		warn_or_die "runsc is not installed: the gVisor tests will be skipped"
		return 0
	}
	local pid=""
	case ${DOCKER_HOST:-unix:///var/run/docker.sock} in
	unix:///var/run/docker.sock | unix:///run/docker.sock)
		pid=$(pidof dockerd 2>/dev/null || pgrep -x dockerd 2>/dev/null || true)
		;;
	esac
	if ! is_root || [ -z "$pid" ]; then
		warn_or_die "runsc is not registered with the Docker engine, and this step can only do it as root for a local dockerd: add {\"runtimes\": {\"runsc\": {\"path\": \"$runsc\", \"runtimeArgs\": [\"${RUNSC_ARGS[0]}\", \"${RUNSC_ARGS[1]}\"]}}} to the engine's daemon.json and reload it"
		return 0
	fi
	say "registering runsc with dockerd (daemon.json, then SIGHUP to reload; dockerd keeps running)"
	mkdir -p /etc/docker
	"$runsc" install --config_file /etc/docker/daemon.json -- "${RUNSC_ARGS[@]}" 2>/dev/null
	# shellcheck disable=SC2086 # one or more PIDs
	kill -HUP $pid
	local _
	for _ in $(seq 1 30); do
		runsc_registered && return 0
		sleep 1
	done
	warn_or_die "dockerd did not pick up runsc after SIGHUP: check /etc/docker/daemon.json and dockerd's log"
}

run_hook() { "$1" || die "$1 failed"; }

if [ "${1:-}" = tool ]; then
	[ $# -eq 2 ] || die "usage: $0 tool NAME"
	install_tool "$2"
	tool_path "$2"
	exit 0
fi
[ $# -eq 0 ] || die "usage: $0 [tool NAME]"

# timed NAME CMD...: runs CMD and says how long it took, in wall-clock and in
# CPU seconds of the processes it waited for. The CPU figure does not grow
# with other load on the machine, so it bounds set-up's time on an idle one.
cpu_ticks() { awk '{print $16 + $17}' "/proc/$$/stat"; }
timed() {
	local name=$1 t0=$SECONDS c0
	shift
	c0=$(cpu_ticks)
	"$@"
	say "$name: $((SECONDS - t0))s, $(awk -v t="$(($(cpu_ticks) - c0))" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", t / hz }')s of CPU"
}

timed docker step_docker
timed packages step_packages
timed go-tools step_go_tools
timed runsc step_runsc
for hook in scripts/test-setup.d/*; do
	[ -x "$hook" ] || continue
	timed "${hook##*/}" run_hook "$hook"
done
say "ready in $SECONDS s"
