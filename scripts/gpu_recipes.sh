#!/usr/bin/env bash
# Multi30k recipe runs side by side on one CUDA GPU (issue #30's runs on a lent machine). The
# recipe's small model leaves a GPU mostly idle (its step is bound by the host process:
# docs/BENCHMARKS.md, "On a GPU"), so several runs, each its own process with a share of the
# cores, share one GPU. Each is a committed recipe with no time cap; the end prints each run's
# test scores. A run not done by DEADLINE is stopped with SIGTERM (it saves a checkpoint there)
# and reported as unfinished; started again with the same RESULTS_DIR, the script skips the runs
# that are done and resumes the others from their last.pt.
#
#   bash scripts/gpu_recipes.sh [DATA_DIR]        (the Multi30k folder; default ../shared/...)
#
# RUNS: "folder:experiment:seed ..." (default: multi30k_en_de_reg with seeds 4, 3 and 5, and
# multi30k_en_de with seeds 4 and 3). DEADLINE: seconds from the start (default 540). THREADS:
# each run's CPU threads (default: the cores shared out). RESULTS_DIR (default gpu_recipes): a
# folder a run, with its log. ARCHIVE: a .tgz to pack RESULTS_DIR into, checkpoints left out (a
# lent machine returns few and small files). ARGS: more overrides for every run. DEVICE (default
# cuda). Wheels of missing dependencies: scripts/gpu_prepare.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/multi30k}
RESULTS_DIR=${RESULTS_DIR:-gpu_recipes}
PY=${PY:-python3}
DEADLINE=${DEADLINE:-540}
DEVICE=${DEVICE:-cuda}
read -ra extra <<<"${ARGS:-}"
RUNS=${RUNS:-"en_de_reg_seed4:multi30k_en_de_reg:4 en_de_reg_seed3:multi30k_en_de_reg:3
en_de_reg_seed5:multi30k_en_de_reg:5 en_de_plain_seed4:multi30k_en_de:4
en_de_plain_seed3:multi30k_en_de:3"}
mkdir -p "$RESULTS_DIR"
source scripts/gpu_env.sh
MULTI30K_ROOT=$(realpath "$DATA")
export MULTI30K_ROOT
read -ra runs <<<"$(echo $RUNS)"
share=$(($(nproc) / ${#runs[@]}))
THREADS=${THREADS:-$((share > 0 ? share : 1))}

# each experiment's corpus and tokenizer prepared once, before the runs read the shared cache
for exp in $(printf '%s\n' "${runs[@]}" | cut -d: -f2 | sort -u); do
    log="$RESULTS_DIR/prepare_$exp.log"
    "$PY" -m seq2seq.cli.prepare experiment="$exp" >"$log" 2>&1 \
        || { echo "preparing $exp failed:"; tail -n 20 "$log"; exit 1; }
done
pids=()
for run in "${runs[@]}"; do
    IFS=: read -r name exp seed <<<"$run"
    [ -f "$RESULTS_DIR/$name/results.json" ] && echo "$name: done already" && continue
    OMP_NUM_THREADS=$THREADS "$PY" -m seq2seq.cli.train experiment="$exp" trainer.seed="$seed" \
        trainer.device="$DEVICE" trainer.max_minutes=0 trainer.progress=false "${extra[@]}" \
        hydra.run.dir="$RESULTS_DIR/$name" >"$RESULTS_DIR/$name.log" 2>&1 &
    pids+=($!)
    echo "$(date -u +%T) $name: experiment=$exp seed $seed ($THREADS threads)"
done
alive() { for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while alive && [ "$SECONDS" -lt "$DEADLINE" ]; do sleep 5; done
if alive; then
    echo "$(date -u +%T) DEADLINE: SIGTERM to the runs still training"
    kill -TERM "${pids[@]}" 2>/dev/null
    for _ in $(seq 60); do alive || break; sleep 1; done
fi
status=0
for run in "${runs[@]}"; do
    IFS=: read -r name _ _ <<<"$run"
    "$PY" - "$RESULTS_DIR/$name" <<'PY' || status=1
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
if (run / "results.json").exists():
    r = json.loads((run / "results.json").read_text())
    scores = ", ".join(
        f"{split}: BLEU lc {s['bleu_lc']} cased {s['bleu']} chrF {s['chrf']}"
        for split, s in r["test_average"].items()
    )
    print(f"{run.name}: {r['steps']} steps, {r['train_minutes']:.1f} min training, "
          f"{r['minutes']:.1f} min in all, {r['precision']}; {scores}")
else:
    log = run / "train_log.jsonl"
    last = log.read_text().splitlines()[-1] if log.exists() else "no step logged"
    print(f"{run.name}: unfinished; last log line: {last[:200]}")
    sys.exit(1)
PY
done
[ -n "${ARCHIVE:-}" ] && tar -czf "$ARCHIVE" --exclude=checkpoints -C "$(dirname "$RESULTS_DIR")" \
    "$(basename "$RESULTS_DIR")"
exit $status
