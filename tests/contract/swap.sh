#!/bin/sh
# swap.sh DDPC SOURCE_DIR: the contract is declared once. A scratch copy of the tree
# has pairs of fields swapped in runtime/ddp_abi.h's lists (settings, a schedule,
# the program, a GEMM, a size, a metric); its compiler and runtime, built from that
# copy, must still train exactly as the real ones do: the same loss and validation
# figures, epoch by epoch, since both sides of the contract follow the one list. (Were
# the order written twice, the swap would either fail to compile or misread.)
set -u
ddpc=$1 source=$(cd "$2" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# the tree as git sees it, new files included (or as it is, without build folders)
if git -C "$source" ls-files --cached --others --exclude-standard > "$scratch/files" 2>/dev/null && [ -s "$scratch/files" ]; then
    (cd "$source" && tar cf - -T "$scratch/files") | (mkdir -p "$scratch/tree" && cd "$scratch/tree" && tar xf -)
else
    mkdir -p "$scratch/tree" && (cd "$source" && tar cf - --exclude='./build*' .) | (cd "$scratch/tree" && tar xf -)
fi
abi=$scratch/tree/runtime/ddp_abi.h
[ -f "$abi" ] || fail "no copy of the tree in $scratch/tree"

# field STRUCT NAME: the line of the entry for NAME in STRUCT's list (the field's name
# is a kind's second argument, or its third for SUB, SUBS and REFS, after the type)
field() {
    awk -v list="#define DDP_FIELDS_$1(X, T)" -v name="$2" '
        index($0, list) == 1 { inside = 1; next }
        inside {
            if (match($0, /X##_[A-Z0-9]+\([^)]*\)/)) {
                call = substr($0, RSTART, RLENGTH)
                kind = call; sub(/^X##_/, "", kind); sub(/\(.*/, "", kind)
                args = call; sub(/^[^(]*\(/, "", args); sub(/\)$/, "", args)
                split(args, arg, /, */)
                if ((kind ~ /^SUB/ || kind == "REFS" ? arg[3] : arg[2]) == name) { print NR; exit }
            }
            if ($0 !~ /\\$/) exit
        }' "$abi"
}

# swap STRUCT NAME_A NAME_B: exchanges the two entries of STRUCT's list
swap() {
    a=$(field "$1" "$2") b=$(field "$1" "$3")
    [ -n "$a" ] && [ -n "$b" ] || fail "no fields $2 and $3 in the list of $1"
    # the entries themselves change places; each line keeps its continuation
    awk -v a="$a" -v b="$b" '
        function entry(s) { match(s, /X##_[A-Z0-9]+\([^)]*\)/); return substr(s, RSTART, RLENGTH) }
        NR == FNR { if (FNR == a) ea = entry($0); if (FNR == b) eb = entry($0); next }
        FNR == a { sub(/X##_[A-Z0-9]+\([^)]*\)/, eb) } FNR == b { sub(/X##_[A-Z0-9]+\([^)]*\)/, ea) } { print }' \
        "$abi" "$abi" > "$abi.new"
    mv "$abi.new" "$abi"
    echo "swapped $1.$2 (line $a) and $1.$3 (line $b)"
}
swap ddp_settings seed epochs
swap ddp_schedule drop final
swap ddp_program input_slot label_slot
swap ddp_gemm transpose_a transpose_b
swap ddp_dim fixed per_sample
swap ddp_metric kind pair
cmp -s "$abi" "$source/runtime/ddp_abi.h" && fail "the swaps changed nothing"

echo "building the swapped compiler and runtime"
cmake -S "$scratch/tree" -B "$scratch/build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$scratch/cmake.log" 2>&1 &&
    cmake --build "$scratch/build" --target ddpc ddprt > "$scratch/build.log" 2>&1 ||
    { tail -n 30 "$scratch/cmake.log" "$scratch/build.log"; fail "the swapped tree does not build"; }

# The same program, built by each compiler, trained on the same data.
mkdir "$scratch/data"
printf 'x0,x1,x2,x3,label\n' > "$scratch/data/tiny.csv"
for i in $(seq 1 40); do echo "$((i % 7)),$((i % 3)),$((i % 5)),1,$((i % 3))" >> "$scratch/data/tiny.csv"; done
cp "$scratch/data/tiny.csv" "$scratch/data/tiny_check.csv"
program=$source/tests/train/tiny.ddp
for side in real swapped; do
    compiler=$ddpc
    [ $side = swapped ] && compiler=$scratch/build/ddpc
    "$compiler" build "$program" -o "$scratch/$side" -Doptimizer=sgd "-Dlearning_rate=step(0.5, drop = 0.5, every = 2 steps)" \
        -Depochs=3 -Dseed=7 "-Dmetrics=[accuracy, top_k_accuracy(k = 2)]" > "$scratch/$side.build" 2>&1 ||
        { cat "$scratch/$side.build"; fail "$side: ddpc build failed"; }
    "$scratch/$side" --data-root "$scratch/data" --threads 1 --metrics "$scratch/$side.json" > "$scratch/$side.out" 2>&1 ||
        { cat "$scratch/$side.out"; fail "$side: training failed"; }
    sed 's/, "samples_per_sec": [^,]*, "seconds": [^,}]*//' "$scratch/$side.json" > "$scratch/$side.figures"
done
grep -q '"epoch": 3' "$scratch/real.figures" || fail "the real program did not train 3 epochs: $(cat "$scratch/real.out")"
if cmp -s "$scratch/real.figures" "$scratch/swapped.figures"; then
    echo "ok: with the fields swapped, the program trains exactly as before:"
    cat "$scratch/swapped.figures"
else
    echo "FAIL: the swapped contract changes what the program does:"
    diff "$scratch/real.figures" "$scratch/swapped.figures"
    exit 1
fi
