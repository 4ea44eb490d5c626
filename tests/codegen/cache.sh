#!/bin/sh
# cache.sh DDPC SAMPLE: ddpc's cache of generated code (compiler/cache.c). A build fills
# it with its four modules (PTX, the emulated GPU's object, the two CPU variants); the
# same build again takes them from it and makes the same bytes; another number of
# epochs reuses all four, f64 code makes four more; a damaged entry (cut
# short, or one byte changed) is made again, and the program is the same bytes; what
# a writer killed midway left goes after an hour;
# DDP_CACHE_SIZE keeps the folder within it, the entries used longest ago going first,
# builds running at once too; a DDP_CACHE_SIZE or DDP_CACHE_DIR it cannot use is named
# in a warning and the build goes on; DDP_CACHE_DIR=off keeps none.
set -u
ddpc=$1 sample=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-cache.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
entries() { ls "$work/cache" 2>/dev/null | grep -c -E '^[0-9a-f]{64}$'; }
export DDP_CACHE_DIR=$work/cache

"$ddpc" build "$sample" -o "$work/first" || exit 1
[ "$(entries)" -eq 4 ] && ok "a build leaves its 4 modules" || fail "a build left $(entries) entries"
"$ddpc" build "$sample" -o "$work/again" || exit 1
cmp -s "$work/first" "$work/again" && [ "$(entries)" -eq 4 ] && ok "the same build again: the same bytes" ||
    fail "the same build again: $(entries) entries, $(cmp "$work/first" "$work/again")"
DDP_CACHE_DIR=off "$ddpc" build "$sample" -o "$work/uncached" || exit 1
cmp -s "$work/first" "$work/uncached" && ok "the same bytes as a build without the cache" ||
    fail "a build without the cache made other bytes"
"$ddpc" build "$sample" -o "$work/epochs" -Depochs=7 || exit 1
[ "$(entries)" -eq 4 ] && ! cmp -s "$work/first" "$work/epochs" && ok "another number of epochs: no module made again" ||
    fail "another number of epochs: $(entries) entries"
"$ddpc" build "$sample" -o "$work/f64" --dtype f64 || exit 1
[ "$(entries)" -eq 8 ] && ok "f64 code: 4 modules more" || fail "f64 code: $(entries) entries"

# damaged entries: every entry of the first build cut short or with a byte changed
i=0
for entry in "$work/cache"/*; do
    i=$((i + 1))
    size=$(wc -c < "$entry")
    if [ $((i % 2)) -eq 0 ]; then
        head -c $((size / 2)) "$entry" > "$work/cut" && mv "$work/cut" "$entry"
    else
        printf 'X' | dd of="$entry" bs=1 seek=$((size - 7)) conv=notrunc 2>/dev/null
    fi
done
# and what writers killed midway left: one an hour old goes at the next write, one
# being written now stays
stale=$work/cache/$(printf '%064d' 0).4242 fresh=$work/cache/$(printf '%064d' 1).4243
echo partial > "$stale" && touch -d '2 hours ago' "$stale" && echo partial > "$fresh"
"$ddpc" build "$sample" -o "$work/repaired" || exit 1
cmp -s "$work/first" "$work/repaired" && ok "damaged entries made again: the same bytes" ||
    fail "damaged entries: the program differs"
[ ! -e "$stale" ] && [ -e "$fresh" ] && ok "a killed writer's file removed after an hour, not before" ||
    fail "a killed writer's files: $(ls "$work/cache" | grep '\.')"
rm -f "$fresh"
"$ddpc" build "$sample" -o "$work/after" && cmp -s "$work/first" "$work/after" || fail "after the repair"

# a limit smaller than the entries: the folder kept within it, or (the entry written
# last larger than the limit itself) holding that one alone; never empty
largest=$(ls -l "$work/cache" | awk 'NR > 1 && $5 > m { m = $5 } END { print m }')
within() {
    total=$(ls -l "$work/cache" | awk 'NR > 1 { t += $5 } END { print t }')
    n=$(entries)
    { [ "$total" -le "$largest" ] || [ "$n" -eq 1 ]; } && [ "$n" -ge 1 ] &&
        ok "$1: $n entries, $total bytes (limit $largest)" || fail "$1: $total bytes in $n entries (limit $largest)"
}
DDP_CACHE_SIZE=$largest "$ddpc" build "$sample" -o "$work/small" -O1 || exit 1
within "DDP_CACHE_SIZE=$largest"

# three builds at once under that limit, each with four code generators writing and
# trimming (one at a time, under the folder's lock): the same
for o in -O0 -O2 -O3; do
    DDP_CACHE_SIZE=$largest "$ddpc" build "$sample" -o "$work/at_once$o" --dtype f64 $o &
done
wait
within "three builds at once"

# settings it cannot use: a warning naming them, and the build as without them
said=$(DDP_CACHE_SIZE=lots "$ddpc" build "$sample" -o "$work/lots" 2>&1)
case $said in
*"ddpc: warning: DDP_CACHE_SIZE=lots is not a size"*) cmp -s "$work/first" "$work/lots" &&
    ok "DDP_CACHE_SIZE=lots: $said" || fail "DDP_CACHE_SIZE=lots: the program differs" ;;
*) fail "DDP_CACHE_SIZE=lots said: $said" ;;
esac
said=$(DDP_CACHE_SIZE=64M "$ddpc" build "$sample" -o "$work/mib" 2>&1)
[ -z "$said" ] && ok "DDP_CACHE_SIZE=64M: taken without a word" || fail "DDP_CACHE_SIZE=64M said: $said"
said=$(DDP_CACHE_DIR=$work/first "$ddpc" build "$sample" -o "$work/file" 2>&1)
case $said in
*"no cache of generated code: cannot make $work/first (DDP_CACHE_DIR): Not a directory"*)
    cmp -s "$work/first" "$work/file" && ok "a DDP_CACHE_DIR that is a file: $said" ||
        fail "a DDP_CACHE_DIR that is a file: the program differs" ;;
*) fail "a DDP_CACHE_DIR that is a file said: $said" ;;
esac

rm -rf "$work/cache"
DDP_CACHE_DIR=off "$ddpc" build "$sample" -o "$work/none" && [ ! -e "$work/cache" ] && [ ! -e off ] &&
    ok "DDP_CACHE_DIR=off: no folder made" || fail "DDP_CACHE_DIR=off"
[ $failures -eq 0 ]
