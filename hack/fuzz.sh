#!/usr/bin/env bash
# Runs every fuzz target of the project (func FuzzXxx(f *testing.F) in a *_test.go file, in this
# module and in examples/) for the given time each (default 3s), one `go test -fuzz` per target as Go
# requires. Seed corpora (f.Add and testdata/fuzz/) already run as plain tests in `go test`; this
# explores beyond them. A crasher is written to the package's testdata/fuzz/<Target>/ and fails the
# run; commit it with the fix so that it stays a regression test.
#
#   hack/fuzz.sh [fuzztime]      e.g. hack/fuzz.sh 2m (make fuzz), hack/fuzz.sh 3s (a quick pass)
set -uo pipefail
cd "$(dirname "$0")/.."
fuzztime="${1:-3s}"
go="${GO:-go}"

rc=0; n=0; start=$SECONDS
while IFS=: read -r file name; do
	dir="$(dirname "$file")"
	mod="."
	if [[ "$dir" == examples/* ]]; then mod="examples"; dir="${dir#examples/}"; fi
	t0=$SECONDS
	if out=$(cd "$mod" && "$go" test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "./$dir" 2>&1); then
		echo "fuzz ok   ${name} ./${file%/*} ($((SECONDS - t0))s with build)"
	else
		echo "fuzz FAIL ${name} ./${file%/*}:"; echo "$out"; rc=1
	fi
	n=$((n + 1))
done < <(grep -rEo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' . | grep -v '/.git/' |
	sed -E 's#^\./##; s#:func (Fuzz[A-Za-z0-9_]*)\(.*#:\1#' | LC_ALL=C sort)
echo "fuzz: ${n} targets, ${fuzztime} each, $((SECONDS - start))s in all"
exit $rc
