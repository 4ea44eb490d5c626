#!/bin/sh
# ci.sh: the whole test run, as the README gives it and as CI runs it on a fresh clone.
# Installs what is missing, then builds two trees and runs every test in each:
#   build/       release, gcc: golden, unit, robustness and documentation tests, and
#                whole programs training on the real Fashion-MNIST
#   build-asan/  clang with AddressSanitizer and UndefinedBehaviorSanitizer, plus a
#                60-second libFuzzer run over the front end
set -eu
cd "$(dirname "$0")/.."
sh .ci/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

CC=clang cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDDP_SANITIZE=ON -DDDP_FUZZ=ON
cmake --build build-asan -j "$jobs"
ctest --test-dir build-asan --output-on-failure -j "$jobs"
echo "ci: all tests passed"
