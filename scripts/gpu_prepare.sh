#!/usr/bin/env bash
# What scripts/gpu_check.sh needs on a GPU machine that reaches no package index, prepared here
# (where pip reaches one): wheels of the dependencies such a machine's Python lacks, at
# constraints.txt's versions and for its Python version, in .whl/, and the Multi30k files in
# .gpu/multi30k/ (both ignored by git). gpu_check.sh installs .whl/ itself when it is there.
#
#   bash scripts/gpu_prepare.sh [DATA_DIR] [PYTHON_VERSION]     (defaults ../shared/data/multi30k, 3.12)
#   ... copy the checkout with .whl/ and .gpu/ to the GPU machine, then there:
#   bash scripts/gpu_check.sh .gpu/multi30k
#
# The list: what a CUDA image that already held torch, transformers, tensorboard, sacrebleu, numpy
# and pytest lacked (an H200 machine's, 2026-11), and sentencepiece, whose version there was
# older than ours. Another image may lack more: pip check there names it.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/multi30k}
PYV=${2:-3.12}
PY=${PY:-python3}
WHEELS="hydra-core omegaconf sentencepiece num2words hydra-joblib-launcher hydra-submitit-launcher submitit"
SOURCE_ONLY="antlr4-python3-runtime docopt"  # no wheels on PyPI: built here (pure Python)
pins() {  # pins NAME...: each NAME==VERSION from constraints.txt, on one line
    local name
    for name in "$@"; do
        grep -i "^$name==" constraints.txt || { echo "$name: not in constraints.txt" >&2; exit 1; }
    done | tr '\n' ' '
}
mkdir -p .whl .gpu/multi30k
wheels=$(pins $WHEELS) && sources=$(pins $SOURCE_ONLY) || exit 1
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $wheels
"$PY" -m pip wheel -q --no-deps -w .whl $sources
cp "$DATA"/*.gz .gpu/multi30k/
ls .whl
echo "$(ls .gpu/multi30k | wc -l) data files in .gpu/multi30k"
