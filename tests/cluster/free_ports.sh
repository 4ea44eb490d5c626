#!/bin/sh
# free_ports.sh N OWNER_PID: prints the first of N consecutive TCP ports that tests may
# listen on, and reserves them for OWNER_PID (a test script) against the other tests
# of this machine. The ports lie
#   - outside the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range),
#     where any outgoing connection on the machine may hold a port at any time;
#   - outside 10000-20000, where programs under srun derive their port base from the
#     job id (slurm(port_range)), so a test's workers never meet a job step's;
#   - away from every port a socket of this machine holds now (/proc/net/tcp, tcp6).
# A reservation is a folder /tmp/ddp-test-ports/PORT naming its owner; one whose owner
# has ended is taken over. Exits 1, saying why, when no run of N ports is free.
# `free_ports.sh --release OWNER_PID` gives back every port the owner reserved.
set -u
locks=/tmp/ddp-test-ports
if [ "$1" = --release ]; then
    grep -lx "$2" "$locks"/*/owner 2>/dev/null | while read -r f; do rm -rf "${f%/owner}"; done
    exit 0
fi
n=$1 owner=$2
mkdir -p "$locks" 2>/dev/null
# (through cat: some kernels' /proc answers the shell's byte-by-byte reads with one byte)
range=$(cat /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
eph_lo=${range%%[!0-9]*} eph_hi=${range##*[!0-9]}
[ -n "$eph_lo" ] && [ -n "$eph_hi" ] || { eph_lo=32768; eph_hi=60999; }

# The windows to draw from: 20000 up to the ephemeral range, and above it.
windows=""
[ $((eph_lo - 1)) -ge $((20000 + n)) ] && windows="20000:$((eph_lo - 1))"
[ $((eph_hi + 1)) -le $((65535 - n)) ] && windows="$windows $((eph_hi + 1)):65535"
[ -z "$windows" ] && { echo "free_ports: no room outside the ephemeral range $eph_lo-$eph_hi" >&2; exit 1; }

# Ports some socket holds now, in any state (a connection's port blocks a listener
# that does not share SO_REUSEADDR with it).
held=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk 'NR > 1 && $2 ~ /:/ {
    split($2, a, ":"); printf "%d\n", ("0x" a[2]) + 0 }' | sort -un | tr '\n' ' ')

is_held() { case " $held " in *" $1 "*) return 0 ;; esac; return 1; }

# reserve PORT: 0 when this owner now holds it (the owner's earlier reservations stay
# its own: they may still be in use)
reserve() {
    if mkdir "$locks/$1" 2>/dev/null; then
        echo "$owner" > "$locks/$1/owner"
        return 0
    fi
    previous=$(cat "$locks/$1/owner" 2>/dev/null)
    # a reservation whose owner has ended is taken over
    if [ -n "$previous" ] && ! kill -0 "$previous" 2>/dev/null; then
        echo "$owner" > "$locks/$1/owner"
        return 0
    fi
    return 1
}
release() { for q in "$@"; do rm -rf "$locks/$q"; done; }

seed=$(( $$ + $(date +%s%N 2>/dev/null | cut -c10-18 | sed 's/^0*//') + 0 ))
tries=0
while [ $tries -lt 200 ]; do
    tries=$((tries + 1))
    for w in $windows; do
        lo=${w%:*} hi=${w#*:}
        span=$((hi - lo + 1 - n))
        [ $span -le 0 ] && continue
        seed=$(( (seed * 1103515245 + 12345) % 2147483648 ))
        base=$(( lo + seed % span ))
        got=""
        ok=1
        p=$base
        while [ $p -lt $((base + n)) ]; do
            if is_held $p || ! reserve $p; then ok=0; break; fi
            got="$got $p"
            p=$((p + 1))
        done
        if [ $ok -eq 1 ]; then
            echo "$base"
            exit 0
        fi
        # shellcheck disable=SC2086
        release $got
    done
done
echo "free_ports: no $n free ports in a row in $windows after $tries draws" >&2
exit 1
