# seq2seq: `make install`, then `make train` and `make test`. Extra Hydra overrides go in ARGS:
#   make train ARGS="pos_encoding=rope trainer.max_steps=500"
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
# newest checkpoint of any run, for translate/evaluate (override with CKPT=...)
CKPT ?= $(shell ls -t outputs/*/*/checkpoints/best.pt 2>/dev/null | head -n 1)
INPUT ?= -
OUTPUT ?= -
OUT ?=
SPLIT ?= test
MULTI30K ?= data/multi30k
# where data=multi30k reads from (make data writes to $(MULTI30K))
MULTI30K_ROOT ?= ../shared/data/multi30k
PAIR ?= en_de
# make sweep / sweep-multi30k: Hydra multiruns over encoding x seed in a fixed folder (run again
# to skip the finished runs and resume the others), SWEEP_JOBS runs at a time in processes of
# their own (hydra/launcher=joblib) with SWEEP_THREADS torch threads each (cores / jobs)
SWEEP_ENCODINGS ?= sinusoidal,learned,relative,t5_bias,alibi,rope,none,kerple,fire,alibi_directional,sin_enc_nope_dec
SWEEP_SEEDS ?= 1,2,3
SWEEP_ARGS ?= experiment=pos_sweep
SWEEP_DIR ?= multirun/pos_sweep
SWEEP_JOBS ?= 2
SWEEP_THREADS ?= $(shell n=$$(( $$(nproc) / $(SWEEP_JOBS) )); echo $$(( n > 0 ? n : 1 )))
SWEEP_LAUNCHER = hydra/launcher=joblib hydra.launcher.n_jobs=$(SWEEP_JOBS) trainer.threads=$(SWEEP_THREADS)
# make sweep-multi30k: every encoding x seed trained short on Multi30k, tested long, and the
# reference (sinusoidal trained on every length) for each seed
POS_M30K_DIR ?= multirun/pos_multi30k
POS_M30K_REF_DIR ?= multirun/pos_multi30k_ref
POS_M30K_SEEDS ?= 1,2,3
POS_M30K_REPORT ?= docs/positional/multi30k
# paired bootstrap resamples: its smallest p, 2/(n+1), must survive Holm over the report's 48
# comparisons (12 systems x BLEU, chrF x long, short); 1000 could never show a difference
POS_M30K_BS ?= 10000
# the document whose report section gets the report's tables and tests
POS_M30K_DOC ?= docs/POSITIONAL_ENCODINGS.md
# the finished runs' report inputs (scripts/sweep_archive.py), committed: restored into the sweep
# folders before it runs (their runs are skipped), saved after; POS_M30K_ARCHIVE= to train all
POS_M30K_ARCHIVE ?= $(POS_M30K_REPORT)/runs
LINT_DIRS := seq2seq tests scripts $(wildcard benchmarks)
# make test / test-full: test processes (pytest-xdist); auto is one a core, at most 8 (each holds
# torch in memory); the in-process tests use one torch thread each (tests/conftest.py), so two
# processes on 2 cores took the suite from 17:51 to 10:28 on an AVX2-only AMD EPYC. 0: one process
TEST_WORKERS ?= auto
XDIST := -n $(TEST_WORKERS) --maxprocesses 8

.DEFAULT_GOAL := help

.PHONY: help install prepare train resume translate evaluate export sweep sweep-multi30k data multi30k test test-slow test-full lint format bench clean

help:  ## this list of targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install:  ## virtualenv + CPU torch (no CUDA wheels without an NVIDIA driver) + seq2seq
	bash scripts/install.sh

prepare:  ## make prepare ARGS="data.root=DIR data.train=[a,b] data.prepared=OUT": tokenize once
	$(PY) -m seq2seq.cli.prepare $(ARGS)

train:  ## the default recipe on the embedded numbers data (no network)
	$(PY) -m seq2seq.cli.train experiment=numbers $(ARGS)

resume:  ## make resume RUN=outputs/<name>/<run> [ARGS=...]: continue a stopped or killed run
	@test -n "$(RUN)" || { echo "usage: make resume RUN=outputs/<name>/<run> [ARGS=\"trainer.max_steps=...\"]"; exit 1; }
	$(PY) -m seq2seq.cli.resume $(RUN) $(ARGS)

translate:  ## make translate INPUT=src.txt OUTPUT=hyp.txt [CKPT=...]
	@test -n "$(CKPT)" || { echo "no checkpoint: run 'make train' or pass CKPT=path/best.pt"; exit 1; }
	$(PY) -m seq2seq.cli.translate ckpt=$(CKPT) input=$(INPUT) output=$(OUTPUT) $(ARGS)

evaluate:  ## make evaluate SPLIT=test [CKPT=...]: BLEU, chrF and TER with signatures
	@test -n "$(CKPT)" || { echo "no checkpoint: run 'make train' or pass CKPT=path/best.pt"; exit 1; }
	$(PY) -m seq2seq.cli.evaluate ckpt=$(CKPT) split=$(SPLIT) lowercase=true $(ARGS)

export:  ## make export OUT=deploy/ct2 [CKPT=...] [ARGS="format=huggingface" or "quantization=int8"]
	@test -n "$(CKPT)" || { echo "no checkpoint: run 'make train' or pass CKPT=path/best.pt"; exit 1; }
	@test -n "$(OUT)" || { echo "usage: make export OUT=deploy/ct2 [CKPT=...] [ARGS=...]"; exit 1; }
	$(PY) -m seq2seq.cli.export ckpt=$(CKPT) out=$(OUT) $(ARGS)

sweep:  ## every encoding x 3 seeds on the numbers task, a multirun in multirun/pos_sweep, 2 at a time (rerun: skips finished runs, resumes the others); a comparison
	$(PY) -m seq2seq.cli.train -m $(SWEEP_ARGS) trainer.seed=$(SWEEP_SEEDS) \
		pos_encoding=$(SWEEP_ENCODINGS) hydra.sweep.dir=$(SWEEP_DIR) $(SWEEP_LAUNCHER) $(ARGS)
	$(PY) scripts/compare_runs.py $(SWEEP_DIR) --length-by items

sweep-multi30k:  ## every encoding x 3 seeds on Multi30k trained on sources <= 10 tokens, tested long, + the all-lengths reference: multirun/ (rerun to resume); the report
ifneq ($(POS_M30K_ARCHIVE),)
	$(PY) scripts/sweep_archive.py restore $(POS_M30K_ARCHIVE)/pos_multi30k_ref $(POS_M30K_REF_DIR)
	$(PY) scripts/sweep_archive.py restore $(POS_M30K_ARCHIVE)/pos_multi30k $(POS_M30K_DIR)
endif
	MULTI30K_ROOT=$(MULTI30K_ROOT) $(PY) -m seq2seq.cli.train -m experiment=pos_multi30k_ref \
		trainer.seed=$(POS_M30K_SEEDS) pos_encoding=sinusoidal \
		hydra.sweep.dir=$(POS_M30K_REF_DIR) $(SWEEP_LAUNCHER) $(ARGS)
	MULTI30K_ROOT=$(MULTI30K_ROOT) $(PY) -m seq2seq.cli.train -m experiment=pos_multi30k \
		trainer.seed=$(POS_M30K_SEEDS) pos_encoding=$(SWEEP_ENCODINGS) \
		hydra.sweep.dir=$(POS_M30K_DIR) $(SWEEP_LAUNCHER) $(ARGS)
ifneq ($(POS_M30K_ARCHIVE),)
	$(PY) scripts/sweep_archive.py save $(POS_M30K_REF_DIR) $(POS_M30K_ARCHIVE)/pos_multi30k_ref
	$(PY) scripts/sweep_archive.py save $(POS_M30K_DIR) $(POS_M30K_ARCHIVE)/pos_multi30k
endif
	MULTI30K_ROOT=$(MULTI30K_ROOT) $(PY) scripts/compare_runs.py $(POS_M30K_DIR) --length-by tokens \
		--baseline sinusoidal --reference $(POS_M30K_REF_DIR) --curves --out $(POS_M30K_REPORT) \
		--bs-samples $(POS_M30K_BS) \
		--doc $(POS_M30K_DOC) --doc-name positional/multi30k \
		--title "Positional encodings on Multi30k En-De, trained on sources of at most 10 tokens"
	MULTI30K_ROOT=$(MULTI30K_ROOT) $(PY) scripts/attention_long.py --sweep $(POS_M30K_DIR) \
		--report $(POS_M30K_REPORT)/comparison.csv --png $(POS_M30K_REPORT)/attention_long.png

data:  ## download Multi30k (needs network) into $(MULTI30K)
	$(PY) scripts/download_multi30k.py --out $(MULTI30K)

multi30k:  ## Multi30k recipe: make multi30k PAIR=en_de|de_en|en_fr (data from MULTI30K_ROOT)
	MULTI30K_ROOT=$(MULTI30K_ROOT) $(PY) -m seq2seq.cli.train experiment=multi30k_$(PAIR) $(ARGS)

test:  ## the CI suite (slow tests excluded), on TEST_WORKERS processes (pytest-xdist)
	$(PY) -m pytest -q $(XDIST)

test-slow:  ## only the slow tests (torch.compile trains like eager): ~1 min on 2 cores
	$(PY) -m pytest -q -m slow

test-full:  ## every test, slow ones included
	$(PY) -m pytest -q -m "" $(XDIST)

lint:  ## ruff (lint + format) on the code, mypy on the package
	$(PY) -m ruff check $(LINT_DIRS)
	$(PY) -m ruff format --check $(LINT_DIRS)
	$(PY) -m mypy

format:  ## ruff: fix what it can, then format
	$(PY) -m ruff check --fix $(LINT_DIRS)
	$(PY) -m ruff format $(LINT_DIRS)

bench:  ## speed benchmarks (installs the bench extra: transformers, ctranslate2); results in benchmarks/results/ and docs/BENCHMARKS.md
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/run_all.py

clean:  ## remove outputs, sweeps, caches
	rm -rf outputs multirun .cache .pytest_cache .ruff_cache
