#!/usr/bin/env bash
# Builds the Kubernetes binaries the test cluster runs (COMPONENTS below) from
# the Go module proxy, in one go build, into a cache directory
# outside the clone, and prints that directory. A second call finds them there
# and builds nothing.
#
#   scripts/kube-build.sh          build if needed; print the bin directory
#
# Environment:
#   TASKRUN_KUBE_VERSION    Kubernetes version (default 1.37.2)
#   TASKRUN_KUBE_CACHE      cache root (default /var/cache/taskrun/kube, or
#                           $XDG_CACHE_HOME/taskrun/kube when not root)
#
# The binaries come from a throwaway module that requires k8s.io/kubernetes
# and replaces each k8s.io staging module kubernetes' own go.mod replaces with
# its published v0.x version, as kubernetes' go.mod points them at ./staging.
set -euo pipefail

GO=${GO:-go}
VERSION=${TASKRUN_KUBE_VERSION:-1.37.2}
STAGING_VERSION=v0.${VERSION#*.}
if [ -n "${TASKRUN_KUBE_CACHE:-}" ]; then
	CACHE=$TASKRUN_KUBE_CACHE
elif [ "$(id -u)" = 0 ]; then
	CACHE=/var/cache/taskrun/kube
else
	CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/taskrun/kube
fi
DIR=$CACHE/v$VERSION
BIN=$DIR/bin
# Only what scripts/kube-up.sh and kube-down.sh start: the control plane and
# the node, whose controller-manager creates the service accounts Pods need
# and deletes the tests' namespaces, and kubectl, which the scripts drive the
# cluster with. Nothing else (kube-proxy among them) is built.
COMPONENTS=(kube-apiserver kubelet kube-scheduler kube-controller-manager kubectl)

# The staging modules k8s.io/kubernetes's go.mod replaces with ./staging/...
STAGING=(
	api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
	cloud-provider cluster-bootstrap code-generator component-base
	component-helpers controller-manager cri-api cri-client cri-streaming
	csi-translation-lib dynamic-resource-allocation endpointslice externaljwt
	kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler
	kubectl kubelet metrics mount-utils pod-security-admission
	sample-apiserver sample-cli-plugin sample-controller streaming
)

say() { printf 'kube-build: %s\n' "$*" >&2; }
die() {
	printf 'kube-build: %s\n' "$*" >&2
	exit 1
}

built() {
	local c
	for c in "${COMPONENTS[@]}"; do [ -x "$BIN/$c" ] || return 1; done
}

if built; then
	echo "$BIN"
	exit 0
fi

mkdir -p "$DIR/src" "$BIN"
# One build at a time per cache directory.
exec 9>"$DIR/.lock"
flock 9
if built; then
	echo "$BIN"
	exit 0
fi

cd "$DIR/src"
if [ ! -f go.sum ] || ! grep -qE "k8s.io/kubernetes v$VERSION( |$)" go.mod 2>/dev/null; then
	say "resolving k8s.io/kubernetes v$VERSION in $DIR/src"
	{
		echo "module taskrun.local/kubebuild"
		echo
		echo "go 1.24"
		echo
		echo "require k8s.io/kubernetes v$VERSION"
		echo
		echo "replace ("
		for m in "${STAGING[@]}"; do echo "	k8s.io/$m => k8s.io/$m $STAGING_VERSION"; done
		echo ")"
	} >go.mod
	# A file importing the commands keeps their dependencies in go.mod.
	{
		echo "//go:build tools"
		echo
		echo "package kubebuild"
		echo
		echo "import ("
		for c in "${COMPONENTS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
		echo ")"
	} >tools.go
	GOFLAGS=-mod=mod "$GO" mod tidy ||
		die "go mod tidy failed in $DIR/src: check that the Go module proxy is reachable (GOPROXY=$("$GO" env GOPROXY))"
fi

# Version stamps as Kubernetes' own build sets them.
PKG=k8s.io/component-base/version
LDFLAGS="-s -w -X $PKG.gitVersion=v$VERSION -X $PKG.gitMajor=${VERSION%%.*}"
minor=${VERSION#*.}
LDFLAGS="$LDFLAGS -X $PKG.gitMinor=${minor%%.*} -X $PKG.gitTreeState=clean -X $PKG.buildDate=1970-01-01T00:00:00Z"
LDFLAGS="$LDFLAGS -X k8s.io/client-go/pkg/version.gitVersion=v$VERSION"
# One go build for every missing command: it loads their package graph once,
# schedules the packages they share once, and keeps every core busy (one
# command links while the others still compile) where one go build per
# command left a core idle during each link.
missing=()
for c in "${COMPONENTS[@]}"; do
	[ -x "$BIN/$c" ] || missing+=("$c")
done
say "building ${missing[*]} v$VERSION in one go build (minutes on a cold cache)"
rm -rf "$DIR/bin.tmp"
mkdir -p "$DIR/bin.tmp"
CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -tags tools -ldflags "$LDFLAGS" \
	-o "$DIR/bin.tmp/" "${missing[@]/#/k8s.io/kubernetes/cmd/}" || die "building ${missing[*]} failed"
for c in "${missing[@]}"; do
	mv "$DIR/bin.tmp/$c" "$BIN/$c"
done
rmdir "$DIR/bin.tmp"
echo "$BIN"
