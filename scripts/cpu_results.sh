#!/usr/bin/env bash
# Every CPU-machine figure of docs/benchmarks.md, in one go, from the repository root:
#   cargo build --release && bash scripts/cpu_results.sh
# Writes docs/results/cpu-*.{txt,json,svg}, then docs/benchmarks.md's Measured section
# from them (scripts/readme_measured.py). Takes about 30 minutes on 2 cores.
# At least 7 rounds per bench: the 95% interval of a median needs 6 runs.
set -euo pipefail
B=target/release/coexec
R=docs/results
mkdir -p "$R"
run() { local name=$1; shift; echo "\$ coexec $*" | tee "$R/$name.txt"; "$B" "$@" --quiet 2>&1 | tee -a "$R/$name.txt"; }
run cpu-workloads bench --repeat 7 --budget 120 --json "$R/cpu-workloads.json" --plot "$R/cpu-workloads.svg"
for X in 0.5 2 10; do
  run "cpu-balance-x$X" bench synthetic --devices "cpu:1,sim:1@$X" --policies hybrid,static,static+dynamic,dynamic,guided,eft --repeat 7 --budget 120 --pairs 9 --json "$R/cpu-balance-x$X.json" --plot "$R/cpu-balance-x$X.svg"
done
run cpu-balance-x2500 bench synthetic --devices cpu:1,sim:1@2500 --work 100000 --size 5000000 --policies hybrid,static,static+dynamic,dynamic,guided,eft --repeat 7 --budget 120 --pairs 9 --json "$R/cpu-balance-x2500.json"
run cpu-overhead bench overhead --repeat 31 --json "$R/cpu-overhead.json"
# A sample timeline: the second run of a job, starting from the profile the first stored.
P=$(mktemp -d)
"$B" run synthetic --devices cpu:2,sim:1@3+200us --size 400000 --work 300 --profile-dir "$P" --quiet >/dev/null
run cpu-trace run synthetic --devices cpu:2,sim:1@3+200us --size 400000 --work 300 --profile-dir "$P" --trace "$R/cpu-sample-trace.json"
rm -rf "$P"
python3 scripts/readme_measured.py
