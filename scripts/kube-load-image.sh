#!/usr/bin/env bash
# Copies Docker images into the test cluster's containerd, where Pods can run
# them with imagePullPolicy: Never (the cluster never pulls from a registry).
#
#   scripts/kube-load-image.sh IMAGE...     e.g. taskrun/testbox:local
#
# Each image goes through `docker save IMAGE | ctr images import`, unpacked for
# the cluster's snapshotter. The cluster must be up (scripts/kube-up.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/kube/lib.sh
. scripts/kube/lib.sh

[ $# -ge 1 ] || die "usage: $0 IMAGE..."
[ -S "$CTRD_SOCK" ] || die "the test cluster is not up (no $CTRD_SOCK): run make kube-up first"
for img in "$@"; do
	docker image inspect "$img" >/dev/null 2>&1 || die "Docker has no image $img: build it first (make images)"
	docker save "$img" | ctr_ images import --snapshotter native - >/dev/null ||
		die "importing $img into the cluster's containerd failed"
	echo "$img"
done
