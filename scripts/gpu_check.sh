#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one go (a lent GPU machine's time is short): SDPA's
# backends timed on new shapes, the CUDA tests, the training benchmark on the GPU (throughput
# and MFU, ours against HF Marian), and the whole test suite with a GPU present (device=auto
# picks it), and trainer.compile against eager on the GPU (compile_bf16). Each part has its own
# time limit, so one that hangs does not take the others with it; the logs and results go to
# $RESULTS_DIR.
#
#   bash scripts/gpu_check.sh [DATA_DIR]      (DATA_DIR: the Multi30k folder)
#
# PARTS: the parts to run, in that order (default: all, most wanted first). DEADLINE: seconds
# from the start that every part must end by (a lease's time; each part's limit is cut to fit,
# and a part with under 20 s left is skipped and counted as failed). SUITE_WORKERS: the whole
# suite's processes (default 8), SUITE_SECONDS its time limit (default 300).
#
# On a machine whose Python lacks some of our dependencies and reaches no package index, run
# scripts/gpu_prepare.sh where pip works: this script installs its .whl/ into /tmp/gpu_site and
# puts that on PYTHONPATH (or put them on PYTHONPATH yourself). The
# results folder holds ~10 files: where only a few files come back from a lent machine, write it
# outside the returned folder and send one archive, e.g.
#   RESULTS_DIR=/tmp/gpu bash scripts/gpu_check.sh DATA; tar -czf "$OUT/gpu.tgz" -C /tmp gpu
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/multi30k}
RESULTS_DIR=${RESULTS_DIR:-gpu_check}
PY=${PY:-python3}
mkdir -p "$RESULTS_DIR"
source scripts/gpu_env.sh
PARTS=${PARTS:-sdpa_backends bench_bf16 cuda_tests test_suite bench_fp32 compile_bf16}
status=0

part() {  # part NAME SECONDS COMMAND...: run it with a time limit, log it, remember a failure
    local name=$1 limit=$2
    shift 2
    if [ -n "${DEADLINE:-}" ] && [ $((DEADLINE - SECONDS)) -lt "$limit" ]; then
        limit=$((DEADLINE - SECONDS))
    fi
    if [ "$limit" -lt 20 ]; then
        echo "== $name: skipped, ${limit} s left before DEADLINE"
        status=1
        return
    fi
    echo "== $name ($(date -u +%H:%M:%S), limit $limit s)"
    timeout "$limit" "$@" >"$RESULTS_DIR/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$RESULTS_DIR/$name.log"
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}

bench() {  # bench PRECISION: ours against HF Marian on the GPU
    part "bench_$1" 240 "$PY" benchmarks/train_throughput.py --device cuda \
        --precision "$1" --data "$DATA" --repeats 2 --steps 10 --warmup 3
}
suite() {  # the whole suite, in SUITE_WORKERS processes (pytest-xdist) and with a per-test limit
    local extra=(--junitxml "$RESULTS_DIR/test_suite.xml")  # (pytest-timeout), where installed;
    # the JUnit file says which tests passed, failed or were skipped, tests/cuda's among them
    "$PY" -c "import xdist" 2>/dev/null && extra+=(-n "${SUITE_WORKERS:-8}" --dist loadfile)
    "$PY" -c "import pytest_timeout" 2>/dev/null && extra+=(--timeout 240)
    part test_suite "${SUITE_SECONDS:-300}" "$PY" -m pytest -q -p no:cacheprovider "${extra[@]}"
}
for p in $PARTS; do
    case $p in
    sdpa_backends) part sdpa_backends 200 "$PY" benchmarks/sdpa_backends.py --data "$DATA" ;;
    bench_bf16) bench bf16 ;;
    bench_fp32) bench fp32 ;;
    cuda_tests) part cuda_tests 240 "$PY" -m pytest -v -p no:cacheprovider tests/cuda ;;
    test_suite) suite ;;
    compile_bf16) part compile_bf16 300 "$PY" benchmarks/train_throughput.py --device cuda \
        --compile-vs-eager --precision bf16 --data "$DATA" --repeats 1 --steps 20 ;;
    *) echo "unknown part $p" && status=1 ;;
    esac
done
cp docs/BENCHMARKS.md benchmarks/results/train_throughput_cuda*.json \
    benchmarks/results/train_compile*_cuda.json benchmarks/results/sdpa_backends.json \
    "$RESULTS_DIR"/ 2>/dev/null
exit $status
