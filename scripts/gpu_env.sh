# Sourced by scripts/gpu_check.sh and scripts/gpu_recipes.sh (run from the checkout's root, with
# PY set): on a machine that reaches no package index, scripts/gpu_prepare.sh's wheels (.whl/)
# go into /tmp/gpu_site, put on PYTHONPATH; then the checkout goes first on PYTHONPATH, and the
# console scripts the CLI tests run are installed beside the interpreter where they are missing
# (editable, without build isolation: such a machine cannot fetch setuptools).
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/gpu_site \
        .whl/*.whl || { echo "installing .whl/ failed"; exit 1; }
    export PYTHONPATH="/tmp/gpu_site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
bin_dir=$("$PY" -c 'import sys, pathlib; print(pathlib.Path(sys.executable).parent)')
[ -x "$bin_dir/seq2seq-train" ] || "$PY" -m pip install -q --no-build-isolation --no-deps -e . \
    || echo "editable install failed: the console-script tests will fail"
"$PY" -c "import sentencepiece; print('sentencepiece', sentencepiece.__version__)"
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
