#!/bin/sh
# coverage.sh DDPC: every diagnostic in the catalogue (ddpc --list-diagnostics) must be
# produced by at least one golden case, found by its [name] in an expectation.
set -u
ddpc=$(realpath "$1")
cd "$(dirname "$0")" || exit 2
missing=0
for name in $("$ddpc" --list-diagnostics | awk -F'`' '{print $2}'); do
    if ! grep -q -F "[$name]" */*.expected; then
        echo "no golden case produces [$name]"
        missing=$((missing + 1))
    fi
done
total=$("$ddpc" --list-diagnostics | wc -l)
echo "$((total - missing)) of $total diagnostics covered"
[ "$missing" -eq 0 ]
