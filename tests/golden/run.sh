#!/bin/sh
# run.sh DDPC CASE [--update]: runs one golden case and compares its output with the
# expectation beside it (CASE with .expected for .ddp), or writes that file with
# --update. Paths are relative to this folder, so the output does not depend on where
# the tree lives.
#
# A case runs `ddpc check CASE` unless its first lines say otherwise:
#   # RUN: ddpc emit --stage=graph %s
# where %s is the case's own path; the folder name picks the default for graph/,
# settings/, ir/, plan/, tokens/ and ast/. The expectation holds the exit status, stdout and stderr.
set -u
ddpc=$(realpath "$1")
case=$2
mode=${3:-}
cd "$(dirname "$0")" || exit 2
expected=${case%.ddp}.expected

run=$(sed -n '1,5s/^# RUN: *//p' "$case" | head -n 1)
if [ -z "$run" ]; then
    case "$case" in
    graph/*) run='ddpc emit --stage=graph %s' ;;
    tokens/*) run='ddpc emit --stage=tokens %s' ;;
    ast/*) run='ddpc emit --stage=ast %s' ;;
    settings/*) run='ddpc emit --stage=settings %s' ;;
    ir/*) run='ddpc emit --stage=ir %s' ;;
    plan/*) run='ddpc emit --stage=plan %s' ;;
    *) run='ddpc check %s' ;;
    esac
fi
run=$(printf '%s\n' "$run" | sed -e "s|%s|$case|g" -e 's|^ddpc$|"$ddpc"|' -e 's|^ddpc |"$ddpc" |')

out=$(mktemp) err=$(mktemp) actual=$(mktemp)
trap 'rm -f "$out" "$err" "$actual"' EXIT
export DDP_STDLIB=../../stdlib NO_COLOR=1
eval "timeout 60 $run" >"$out" 2>"$err"
status=$?
{
    echo "exit $status"
    echo "--- stdout"
    cat "$out"
    echo "--- stderr"
    cat "$err"
} >"$actual"

if [ "$mode" = "--update" ]; then
    cp "$actual" "$expected"
    exit 0
fi
if [ ! -f "$expected" ]; then
    echo "no expectation $expected; run tests/golden/update.sh to write it" >&2
    cat "$actual" >&2
    exit 1
fi
if ! diff -u "$expected" "$actual"; then
    echo "FAIL $case: output differs from $expected (tests/golden/update.sh rewrites it)" >&2
    exit 1
fi
