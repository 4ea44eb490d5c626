#!/bin/sh
# interrupted.sh DDPC SAMPLE: ddpc build's temporary files go to $TMPDIR, and none is
# left behind when the build ends: done, stopped by SIGINT, SIGTERM or SIGHUP midway
# (the status the signal gives, 128 + its number, and no child left running to write
# its file again), or refused a TMPDIR that is not there (status 1, the folder named).
set -u
ddpc=$1 sample=$2
export DDP_CACHE_DIR=off # builds that generate their code, for the whole time they take
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-interrupted.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/tmp"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
count() { ls "$work/tmp" | wc -l; }

for pair in INT:2 TERM:15 HUP:1; do
    signal=${pair%:*}
    TMPDIR=$work/tmp "$ddpc" build "$sample" -o "$work/program" 2> "$work/err" &
    pid=$!
    i=0 # until the children's files are there (the front end takes a moment)
    while [ "$(count)" -eq 0 ] && [ $i -lt 600 ]; do
        sleep 0.05
        i=$((i + 1))
    done
    during=$(count)
    kill -$signal $pid
    wait $pid
    status=$?
    # no code generator left running (each has TMPDIR in its environment), which would
    # write its file again
    left=$(grep -l -s "TMPDIR=$work/tmp" /proc/[0-9]*/environ | wc -l)
    [ "$left" -eq 0 ] || fail "SIG$signal: $left code generators left running"
    sleep 1
    want=$((128 + ${pair#*:}))
    if [ "$during" -gt 0 ] && [ $status -eq $want ] && [ "$(count)" -eq 0 ] && [ ! -e "$work/program" ]; then
        echo "ok: SIG$signal during the build: status $status, the $during temporary files in TMPDIR removed"
    else
        fail "SIG$signal: $during files during the build, status $status (want $want), left: $(ls "$work/tmp")"
    fi
done

if TMPDIR=$work/tmp "$ddpc" build "$sample" -o "$work/program" && [ "$(count)" -eq 0 ] && [ -x "$work/program" ]; then
    echo "ok: a build to its end leaves TMPDIR empty"
else
    fail "a build to its end: left $(ls "$work/tmp")"
fi
said=$(TMPDIR=$work/none "$ddpc" build "$sample" -o "$work/other" 2>&1)
status=$?
case $said in
*"cannot make a temporary file in $work/none (TMPDIR): No such file or directory"*)
    [ $status -eq 1 ] && echo "ok: a TMPDIR that is not there: status 1, $said" || fail "TMPDIR not there: status $status" ;;
*) fail "a TMPDIR that is not there: status $status, $said" ;;
esac
[ $failures -eq 0 ]
