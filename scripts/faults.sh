#!/usr/bin/env bash
# Runs the fault catalog (docs/faults.md): every test a case names, grouped
# by package, then prints one line per case: PASS, FAIL, SKIP (a part the
# test needs is missing) or NONE (no test injects the fault yet). Exits 1
# when a case failed.
#
# A case's tests are read from its row: backticked `./pkg` names a package,
# backticked `TestName` a test of the last package named. Environment:
# GO (default go), TEST_TIMEOUT (default 40m), FAULTS_RUN (a regexp of case
# IDs to run, e.g. FAULTS_RUN='H0[67]|B06'; default all), TASKRUN_FAULTS_LONG
# (default 1: the 200-run case runs; 0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TEST_TIMEOUT=${TEST_TIMEOUT:-40m}
FAULTS_RUN=${FAULTS_RUN:-[HB][0-9]+}
catalog=docs/faults.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# cases: "ID pkg:Test pkg:Test ..." per row.
awk -F'|' '/^\| [HB][0-9]+ \|/ {
	id=$2; gsub(/ /, "", id); row=$NF; if (row == "") row=$(NF-1)
	line=id; pkg=""
	n=split(row, parts, "`")
	for (i=2; i<=n; i+=2) {
		tok=parts[i]
		if (tok ~ /^\.(\/|$)/) pkg=tok
		else if (tok ~ /^Test[A-Za-z0-9_]+$/ && pkg != "") line=line " " pkg ":" tok
	}
	print line
}' "$catalog" | grep -E "^(${FAULTS_RUN})( |$)" >"$work/cases" || true

# The packages and their tests, in order; ./faults runs whole.
pkgs=$(tr ' ' '\n' <"$work/cases" | awk -F: 'NF == 2 && !seen[$1]++ {print $1}')
status=0
for pkg in $pkgs; do
	if [ "$pkg" = ./faults ]; then
		run=.
	else
		run="^($(tr ' ' '\n' <"$work/cases" | awk -F: -v p="$pkg" '$1 == p {print $2}' | sort -u | paste -sd'|'))\$"
	fi
	echo "go test -count=1 -timeout $TEST_TIMEOUT -v -run '$run' $pkg" >&2
	log="$work/$(echo "$pkg" | tr '/.' '__').log"
	TASKRUN_WORKER_E2E_RUNS=${TASKRUN_WORKER_E2E_RUNS:-100} TASKRUN_FAULTS_LONG=${TASKRUN_FAULTS_LONG:-1} \
		$GO test -count=1 -timeout "$TEST_TIMEOUT" -v -run "$run" "$pkg" >"$log" 2>&1 || {
		status=1
		# The log goes with the work dir: keep what says why.
		grep -E -B40 '^--- FAIL' "$log" | tail -80 | sed 's/^/  | /' >&2 || true
	}
	grep -E '^(--- (FAIL|SKIP)|FAIL|ok)' "$log" | sed 's/^/  /' >&2 || true
done

# A test's result in its package's log: its top-level --- line.
result() {
	local log="$work/$(echo "$1" | tr '/.' '__').log"
	if grep -qE "^--- FAIL: $2 " "$log"; then echo FAIL
	elif grep -qE "^--- PASS: $2 " "$log"; then echo PASS
	elif grep -qE "^--- SKIP: $2 " "$log"; then echo SKIP
	else echo FAIL; fi # not run: build failure or a panic
}

echo
failed=0
while read -r id tests; do
	if [ -z "$tests" ]; then
		printf '%-4s NONE  no test injects this fault (docs/faults.md)\n' "$id"
		continue
	fi
	verdict=PASS
	detail=""
	for pt in $tests; do
		r=$(result "${pt%%:*}" "${pt#*:}")
		detail="$detail ${pt#*:}=$r"
		case $r in
		FAIL) verdict=FAIL ;;
		SKIP) [ $verdict = PASS ] && verdict=SKIP ;;
		esac
	done
	[ $verdict = FAIL ] && failed=$((failed + 1))
	printf '%-4s %-5s%s\n' "$id" "$verdict" "$detail"
done <"$work/cases"
if [ $failed -gt 0 ] || [ $status -ne 0 ]; then
	echo "faults: $failed case(s) failed"
	exit 1
fi
