#!/bin/sh
# update.sh [DDPC]: rewrites every golden expectation from the current compiler.
# Review the result with `git diff tests/golden` before committing it.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ddpc=$(realpath "${1:-$here/../../build/ddpc}")
cd "$here"
for f in */*.ddp; do
    sh run.sh "$ddpc" "$f" --update
done
git status --short -- . || true
