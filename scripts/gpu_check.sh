#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one go (a lent GPU machine's time is short): SDPA's
# backends timed on new shapes, the CUDA tests, the training benchmark on the GPU (throughput
# and MFU, ours against HF Marian), and the whole test suite with a GPU present (device=auto
# picks it). Each part has its own time limit,
# so one that hangs does not take the others with it; the logs and results go to $RESULTS_DIR.
#
#   bash scripts/gpu_check.sh [DATA_DIR]      (DATA_DIR: the Multi30k folder)
#
# On a machine whose Python lacks some of our dependencies, put them on PYTHONPATH first. The
# results folder holds ~10 files: where only a few files come back from a lent machine, write it
# outside the returned folder and send one archive, e.g.
#   RESULTS_DIR=/tmp/gpu bash scripts/gpu_check.sh DATA; tar -czf "$OUT/gpu.tgz" -C /tmp gpu
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/multi30k}
RESULTS_DIR=${RESULTS_DIR:-gpu_check}
PY=${PY:-python3}
mkdir -p "$RESULTS_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

part() {  # part NAME SECONDS COMMAND...: run it with a time limit, log it, remember a failure
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S))"
    timeout "$limit" "$@" >"$RESULTS_DIR/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$RESULTS_DIR/$name.log"
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# the console scripts the CLI tests run sit beside the interpreter: install them where missing
# (without build isolation: a lent machine reaches no registry to fetch setuptools)
bin_dir=$("$PY" -c 'import sys, pathlib; print(pathlib.Path(sys.executable).parent)')
[ -x "$bin_dir/seq2seq-train" ] || "$PY" -m pip install -q --no-build-isolation --no-deps -e . \
    || echo "editable install failed: the console-script tests will fail"
"$PY" -c "import sentencepiece; print('sentencepiece', sentencepiece.__version__)"
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
# most wanted first: a part cut short by the machine's time leaves the earlier ones done
part sdpa_backends 200 "$PY" benchmarks/sdpa_backends.py --data "$DATA"
bench() {  # bench PRECISION: ours against HF Marian on the GPU
    part "bench_$1" 240 "$PY" benchmarks/train_throughput.py --device cuda \
        --precision "$1" --data "$DATA" --repeats 2 --steps 10 --warmup 3
}
bench bf16
part cuda_tests 240 "$PY" -m pytest -v -p no:cacheprovider tests/cuda
# in 8 processes (pytest-xdist) and with a per-test limit (pytest-timeout) where they are installed
extra=()
"$PY" -c "import xdist" 2>/dev/null && extra+=(-n 8 --dist loadfile)
"$PY" -c "import pytest_timeout" 2>/dev/null && extra+=(--timeout 240)
part test_suite "${SUITE_SECONDS:-300}" "$PY" -m pytest -q -p no:cacheprovider "${extra[@]}"
bench fp32
cp docs/BENCHMARKS.md benchmarks/results/train_throughput_cuda*.json \
    benchmarks/results/sdpa_backends.json "$RESULTS_DIR"/ 2>/dev/null
exit $status
