"""Data pipeline at scale (issue #17, "corpora of any size"): the old in-memory path against the
prepared one, on synthetic corpora of 29k to 20M pairs.

    python benchmarks/data_scale.py [--sizes 29000,1000000,5000000,20000000]
        [--work /tmp/data_scale] [--steps 50] [--data DIR] [--no-old] [--no-doc]
        [--old-from JSON] [--report JSON] [--speed-repeats 3] [--speed-size 1000000]

Corpora: <work>/corpus-N/train.{en,de}: N pairs, each the first half (of the words, rounded
down) of a random Multi30k en-de training pair and the second half of another, on both sides
(seeded; reused while corpus.json matches), and Multi30k's val and test files. Per size, each in
its own process: new, seq2seq-prepare, then `seq2seq.cli.train` with data.prepared; old, the same
training in a worktree of OLD_COMMIT (which tokenizes every line at start), and its
read_parallel + encode_batch alone. Training: model=tiny, fp32, --steps steps, tokenizer caches
emptied first. Time to first step: launch to the Hydra log line "model: ... parameters" (just
before step 1) and to step 1 in TensorBoard; peak RSS: wait4's ru_maxrss (which counts the
parent's peak: this process imports nothing heavy) and the sampled PSS of all the child's
processes. The old path is skipped where its RSS, on a line through the sizes measured (1.2 GB +
1.7 GB per 1M pairs before two are), would exceed 80% of MemTotal. Results: <work>/data_scale.json
after each size; benchmarks/results/data_scale.json and docs/BENCHMARKS.md unless --no-doc.
One run's steps/s depends on the batches its first steps draw (the two paths shuffle
differently), so training speed is also compared over --speed-repeats runs of each path at
--speed-size pairs, alternating which runs first (mean ± std).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common import ROOT, multi30k_root, peak_rss_mb, split_file
from data_scale_report import DISTURBED, SAMPLE_S, SEED, label, publish, report

DEFAULT_SIZES = "29000,1000000,5000000,20000000"
OLD_COMMIT = "86a2410"  # the last commit before the prepared data path
OLD_TREE = Path("/tmp/seq2seq_old")
CHUNK = 1_000_000  # synthetic pairs generated (and held) at a time
REPORTED_OLD_RSS_MB = (1200.0, 1700.0)  # old path: MB + MB per 1M pairs, until two are measured
MEM_SHARE = 0.8  # the old path runs where its estimated RSS stays below this share of MemTotal
LANGS = ("en", "de")
Result = dict[str, Any]  # one step's figures (or {"skipped": why} / {"error": what})
Points = list[tuple[int, float]]  # (pairs, peak RSS in MB) of the old path's runs
MODEL_LINE = re.compile(r"model: ([\d,]+) parameters")
TRAIN_PAIRS = re.compile(r"train ([\d,]+) pairs")
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
# steps only: one validation at the end (of one BLEU sentence), no test splits, no averaging
TRAIN_ARGS = [
    *("trainer.valid_every=1000000", "trainer.valid_bleu_sentences=1", "trainer.precision=fp32"),
    *("trainer.max_tokens=4096", "trainer.log_every=1", "trainer.progress=false"),
    *("trainer.average_last=0", "trainer.keep_last=0", "data.test=[]"),
]


def say(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def halves(line: str) -> tuple[str, str]:
    """The first half of the words (rounded down; a trailing space unless empty), the second."""
    words = line.split()
    head = " ".join(words[: len(words) // 2])
    return (head + " " if head else ""), " ".join(words[len(words) // 2 :])


def generate(data: Path, out: Path, pairs: int, seed: int) -> None:
    """(child) out/train.{en,de}: `pairs` recombined Multi30k pairs, CHUNK at a time."""
    import numpy as np

    sides = {}
    for lang in LANGS:
        with gzip.open(split_file(data, f"train.{lang}"), "rt", encoding="utf-8") as f:
            sides[lang] = [halves(line) for line in f.read().rstrip("\n").split("\n")]
    n = len(sides["en"])
    assert n == len(sides["de"]), "Multi30k train.en and train.de differ in length"
    rng = np.random.default_rng(seed)
    with contextlib.ExitStack() as stack:
        files = {
            x: stack.enter_context(open(out / f"{x}.tmp", "w", encoding="utf-8")) for x in LANGS
        }
        for start in range(0, pairs, CHUNK):
            a, b = rng.integers(0, n, size=(2, min(CHUNK, pairs - start))).tolist()
            for lang, parts in sides.items():
                files[lang].write("".join([parts[i][0] + parts[j][1] + "\n" for i, j in zip(a, b)]))
    for lang in LANGS:
        os.replace(out / f"{lang}.tmp", out / f"train.{lang}")


def ensure_corpus(work: Path, pairs: int, data: Path) -> tuple[Path, dict[str, Any]]:
    """<work>/corpus-N, generated in a child process unless its marker matches the files."""
    out = work / f"corpus-{pairs}"
    out.mkdir(parents=True, exist_ok=True)
    for split in ("val", "test_2016_flickr", "test_2017_flickr"):  # copied unchanged
        for name in (split_file(data, f"{split}.{x}") for x in LANGS):
            shutil.copyfile(name, out / name.name)

    def marker() -> dict[str, Any]:
        sizes = {f"train.{x}": (out / f"train.{x}").stat().st_size for x in LANGS}
        return {"pairs": pairs, "seed": SEED, "multi30k": str(data), "bytes": sizes}

    with contextlib.suppress(OSError, ValueError):
        if json.loads((out / "corpus.json").read_text()) == marker():
            say(f"corpus {label(pairs)}: reusing {out}")
            return out, {"reused": True, **marker()}
    start = time.perf_counter()
    cmd = f"{sys.executable} {__file__} --generate {pairs} --work {out} --data {data}".split()
    subprocess.run(cmd, check=True)
    seconds = time.perf_counter() - start
    (out / "corpus.json").write_text(json.dumps(marker(), indent=2) + "\n")
    say(f"corpus {label(pairs)}: generated in {seconds:.1f} s")
    return out, {"reused": False, "generate_s": seconds, **marker()}


def ensure_worktree() -> str:
    """The old code's worktree at OLD_TREE (created once); returns its commit."""
    if not (OLD_TREE / "seq2seq" / "train.py").exists():
        git = ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(OLD_TREE), OLD_COMMIT]
        subprocess.run(git, check=True)
    git = ["git", "-C", str(OLD_TREE), "rev-parse", "HEAD"]
    head = subprocess.run(git, capture_output=True, text=True, check=True).stdout.strip()
    if not head.startswith(OLD_COMMIT):
        raise SystemExit(f"{OLD_TREE} is at {head}, not {OLD_COMMIT}: remove it or check it out")
    return head


def child_env(old: bool) -> dict[str, str]:
    """This environment without MULTI30K_ROOT; PYTHONPATH is the old worktree for the old path."""
    env = {k: v for k, v in os.environ.items() if k not in ("MULTI30K_ROOT", "PYTHONPATH")}
    return {**env, "PYTHONPATH": str(OLD_TREE)} if old else env


def tree_pss_mb(root: int) -> float:
    """PSS (MB) of process `root` and its descendants (workers), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        with contextlib.suppress(OSError, IndexError, ValueError):
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            total += int(rollup.split("\nPss:", 1)[1].split()[0])
    return total / 1024


def sample_tree(pid: int, peak: list[float], done: threading.Event) -> None:
    while not done.wait(SAMPLE_S):
        peak[0] = max(peak[0], tree_pss_mb(pid))


def busy_cpu_s() -> float:
    """CPU seconds the machine has been busy (all but idle and iowait)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def run_child(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, what: str) -> Result:
    """Run `cmd` (output to `log`), wait4 for it while a thread samples its processes' PSS.
    Returns its launch time (epoch s), wall s, ru_maxrss (its largest process), peak PSS of all
    its processes, and the CPU s other processes used meanwhile; or the error."""
    log.parent.mkdir(parents=True, exist_ok=True)
    peak, done = [0.0], threading.Event()
    with open(log, "w") as out:
        busy, launched = busy_cpu_s(), time.time()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        sampler = threading.Thread(target=sample_tree, args=(proc.pid, peak, done), daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.time() - launched
        other = busy_cpu_s() - busy - usage.ru_utime - usage.ru_stime
    done.set()
    sampler.join()
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        say(f"{what} FAILED (exit {code}), {log}:\n  " + "\n  ".join(tail))
        return {"error": f"{what}: exit code {code}", "log": str(log), "tail": tail}
    if other > DISTURBED * seconds:
        say(f"warning: other processes used {other:.1f} CPU s during these {seconds:.1f} s")
    rss = usage.ru_maxrss / 1024
    figures = {"wall_s": seconds, "peak_rss_mb": rss, "peak_tree_pss_mb": peak[0]}
    return {"launched": launched, **figures, "other_cpu_s": other}


def command(module: str, corpus: Path, cache: Path, run_dir: Path, *extra: str) -> list[str]:
    """`python -m module` with the overrides of every run (after emptying its folders)."""
    for folder in (cache, run_dir):
        shutil.rmtree(folder, ignore_errors=True)
    common = f"experiment=multi30k_en_de model=tiny data.root={corpus} "
    common += f"tokenizer.cache_dir={cache} hydra.run.dir={run_dir}"
    return [sys.executable, "-m", module, *common.split(), *extra]


def prepare(module: str, corpus: Path, work: Path, pairs: int) -> tuple[Path, Result]:
    """The new seq2seq-prepare (`module`) on `corpus`; its output directory and figures."""
    out, run_dir = work / f"prepared-{pairs}", work / "runs" / f"prepare-{pairs}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = command(module, corpus, work / "tok-cache" / f"new-{pairs}", run_dir)
    say(f"new {label(pairs)}: prepare")
    log = work / "logs" / f"prepare-{pairs}.out"
    cmd.append(f"data.prepared={out}")
    result = run_child(cmd, ROOT, child_env(old=False), log, f"{module} (prepare)")
    if "error" in result or not out.is_dir():
        return out, result if "error" in result else {"error": f"exit 0 but no {out}"}
    du = subprocess.run(["du", "-s", "--block-size=1", str(out)], capture_output=True, text=True)
    result.update(pairs_per_s=pairs / result["wall_s"], disk_bytes=int(du.stdout.split()[0]))
    seconds = json.loads((out / "manifest.json").read_text()).get("seconds", {})
    result["phase_s"] = seconds  # prepare's own timing of its two passes
    if seconds.get("tokenize_and_write"):
        result["tokenize_pass_pairs_per_s"] = pairs / seconds["tokenize_and_write"]
    say(f"new {label(pairs)}: prepared, {result}")
    return out, result


def log_time(run_dir: Path) -> tuple[float | None, dict[str, int]]:
    """Epoch time of the Hydra log line "model: ... parameters", and the counts it gives."""
    for log in sorted(run_dir.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            stamp, found = LOG_TIME.match(line), MODEL_LINE.search(line)
            if stamp and found:
                when = dt.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                counts = {"params": int(found.group(1).replace(",", ""))}
                if pairs := TRAIN_PAIRS.search(line):
                    counts["train_pairs"] = int(pairs.group(1).replace(",", ""))
                return when, counts
    return None, {}


def tb_times(run_dir: Path) -> dict[int, float]:
    """(child: TensorBoard's imports would raise the parent's peak RSS) Wall time of each
    step's train/loss scalar in run_dir/tb."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    if "train/loss" not in acc.Tags().get("scalars", []):
        return {}
    return {int(e.step): float(e.wall_time) for e in acc.Scalars("train/loss")}


def speed(run_dir: Path, steps: int, launched: float) -> dict[str, Any]:
    """Time to step 1, and steps/s and target tokens/s over steps warm+1..steps, from the wall
    times in TensorBoard and train_log.jsonl's tokens (its records carry no times); else steps/s
    from results.json's steps and train_minutes (which include the final validation and save)."""
    cmd = [sys.executable, __file__, "--tb-times", str(run_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env(False))
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else ["{}"]
    times, warm = {int(k): v for k, v in json.loads(lines[-1]).items()}, min(10, steps // 5)
    if warm >= 1 and {1, warm, steps} <= times.keys():
        seconds, basis = times[steps] - times[warm], f"steps {warm + 1}..{steps}"
        records = [json.loads(x) for x in (run_dir / "train_log.jsonl").read_text().splitlines()]
        tokens = sum(r["tokens"] for r in records if r["type"] == "train" and r["step"] > warm)
        rates = {"steps_per_s": (steps - warm) / seconds, "tgt_tokens_per_s": tokens / seconds}
        basis = f"TensorBoard wall times of {basis}"
        return {"to_step1_s": times[1] - launched, **rates, "steps_per_s_basis": basis}
    say(f"no step times in {run_dir / 'tb'}: {out.stderr[-300:]}")
    with contextlib.suppress(OSError, ValueError, KeyError, ZeroDivisionError):
        summary = json.loads((run_dir / "results.json").read_text())
        rate = summary["steps"] / (60 * summary["train_minutes"])
        return {"steps_per_s": rate, "steps_per_s_basis": "results.json steps / train_minutes"}
    return {"steps_per_s": None, "steps_per_s_basis": "no step times found"}


def train(kind: str, corpus: Path, args: argparse.Namespace, pairs: int, *extra: str) -> Result:
    """One training run of the `kind` (new/old) path: time to first step, memory, steps/s."""
    work, run_dir = args.work, args.work / "runs" / f"{kind}-{pairs}"
    cache = work / "tok-cache" / f"{kind}-train-{pairs}"
    cmd = command("seq2seq.cli.train", corpus, cache, run_dir, *TRAIN_ARGS, *extra)
    say(f"{kind} {label(pairs)}: train {args.steps} steps")
    log, old = work / "logs" / f"{kind}-{pairs}.out", kind == "old"
    cmd.append(f"trainer.max_steps={args.steps}")
    result = run_child(cmd, OLD_TREE if old else ROOT, child_env(old), log, f"{kind} training")
    if "error" in result:
        return result
    model_time, counts = log_time(run_dir)
    launched = result["launched"]
    result["to_model_line_s"] = None if model_time is None else model_time - launched
    result.update(speed(run_dir, args.steps, launched), **counts)
    shown = {k: round(v, 2) for k, v in result.items() if isinstance(v, float) and k != "launched"}
    say(f"{kind} {label(pairs)}: {shown}")
    return result


def tokenize_old(corpus: Path, model: Path) -> dict[str, Any]:
    """(child, in the old worktree) The old read_parallel + encode_batch of both sides, timed."""
    import seq2seq
    from seq2seq.data.text import read_parallel
    from seq2seq.data.tokenizer import SentencePieceTokenizer

    tok = SentencePieceTokenizer("bpe", model.read_bytes())
    start = time.perf_counter()
    pairs = read_parallel(corpus / "train.en", corpus / "train.de")
    read = time.perf_counter() - start
    src, tgt = tok.encode_batch([p[0] for p in pairs]), tok.encode_batch([p[1] for p in pairs])
    seconds = time.perf_counter() - start
    tokens = sum(map(len, src)) + sum(map(len, tgt))
    timed = {"pairs": len(pairs), "read_s": read, "seconds": seconds, "tokens": tokens}
    return {**timed, "pairs_per_s": len(pairs) / seconds, "package": seq2seq.__file__}


def old_tokenization(corpus: Path, work: Path, pairs: int, prepared: Path | None) -> Result:
    """tokenize_old in the old worktree, with the prepared model (else the old run's)."""
    places = [p for p in (prepared, work / "tok-cache" / f"old-train-{pairs}") if p]
    models = [m for p in places if p.exists() for m in sorted(p.rglob("*.model"))]
    if not models:
        return {"skipped": f"no SentencePiece model in {', '.join(map(str, places))}"}
    say(f"old {label(pairs)}: read + encode_batch with {models[0]}")
    cmd = [sys.executable, __file__, "--old-tokenize", str(corpus), "--model", str(models[0])]
    log = work / "logs" / f"old-tokenize-{pairs}.out"
    result = run_child(cmd, OLD_TREE, child_env(old=True), log, "old tokenization")
    if "error" in result:
        return result
    result.update(json.loads(log.read_text().strip().splitlines()[-1]), model=str(models[0]))
    if not str(result["package"]).startswith(str(OLD_TREE)):
        raise SystemExit(f"old tokenization imported {result['package']}, not the old worktree")
    say(f"old {label(pairs)}: {result['pairs_per_s']:,.0f} pairs/s read + tokenized")
    return result


def estimate_old_rss(measured: Points, pairs: int) -> tuple[float, str]:
    """The old path's peak RSS (MB) at `pairs`: the line through the smallest and largest size
    measured, else REPORTED_OLD_RSS_MB."""
    (x0, y0), (x1, y1) = min(measured, default=(0, 0.0)), max(measured, default=(0, 0.0))
    if x1 > x0:
        basis = f"line through the old path's RSS at {label(x0)} and {label(x1)} pairs"
        return y1 + (y1 - y0) / (x1 - x0) * (pairs - x1), basis
    base, per_million = REPORTED_OLD_RSS_MB
    basis = f"reported {base:.0f} MB + {per_million:.0f} MB per 1M pairs"
    return base + per_million * pairs / 1e6, basis


def mem_total_mb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20


def old_path(pairs: int, corpus: Path, args: argparse.Namespace, measured: Points) -> Result:
    """The old path's training run, unless --no-old or its estimated RSS does not fit."""
    limit = MEM_SHARE * mem_total_mb()
    estimate, basis = estimate_old_rss(measured, pairs)
    if args.no_old:
        return {"skipped": "--no-old"}
    if estimate > limit:
        reason = f"estimated RSS {estimate:,.0f} MB ({basis}) > {MEM_SHARE:.0%} of MemTotal "
        say(f"old {label(pairs)}: skipped, {reason}({limit:,.0f} MB)")
        return {"skipped": reason + f"({limit:,.0f} MB)", "estimated_rss_mb": estimate}
    result: Result = {"estimated_rss_mb": estimate, "estimate_basis": basis}
    result.update(train("old", corpus, args, pairs))
    if "peak_rss_mb" in result:
        measured.append((pairs, result["peak_rss_mb"]))
    return result


def old_figures(path: Path, pairs: int) -> tuple[Result, Result] | None:
    """The old path's figures at `pairs` from an earlier run's JSON (--old-from), marked so."""
    for r in json.loads(path.read_text())["results"]:
        if r["pairs"] == pairs:
            note = {"from": f"{path} ({r.get('date', 'earlier run')})"}
            return {**r["old"], **note}, {**r["old_tokenize"], **note}
    return None


def run_size(pairs: int, args: argparse.Namespace, measured: Points) -> Result:
    """Every figure of one corpus size; `measured` collects the old path's (pairs, RSS)."""
    corpus, info = ensure_corpus(args.work, pairs, args.data)
    r: dict[str, Any] = {"pairs": pairs, "corpus": info, "date": dt.datetime.now().isoformat()}
    prepared: Path | None = None
    if args.prepare is not None:
        prepared, r["prepare"] = prepare(args.prepare, corpus, args.work, pairs)
        if "error" in r["prepare"]:
            prepared, r["new"] = None, {"skipped": "seq2seq-prepare failed"}
        else:
            r["new"] = train("new", corpus, args, pairs, f"data.prepared={prepared}")
    else:
        r["prepare"] = r["new"] = {"skipped": args.new_missing}
    earlier = old_figures(args.old_from, pairs) if args.old_from else None
    if earlier is not None:  # the old path's code is fixed (OLD_COMMIT): its figures stand
        r["old"], r["old_tokenize"] = earlier
    else:
        r["old"] = old_path(pairs, corpus, args, measured)
        if "skipped" in r["old"]:
            r["old_tokenize"] = {"skipped": r["old"]["skipped"]}
        else:
            r["old_tokenize"] = old_tokenization(corpus, args.work, pairs, prepared)
    with contextlib.suppress(KeyError):
        ratio = r["prepare"]["pairs_per_s"] / r["old_tokenize"]["pairs_per_s"]
        r["prepare_vs_old_tokenize"] = ratio
    with contextlib.suppress(KeyError):  # the same lines, the same tokenizer, tokenized
        ratio = r["prepare"]["tokenize_pass_pairs_per_s"] / r["old_tokenize"]["pairs_per_s"]
        r["tokenize_pass_vs_old_tokenize"] = ratio
    with contextlib.suppress(KeyError):  # read + train the tokenizer + tokenize, end to end
        r["prepare_vs_old_start"] = r["old"]["to_model_line_s"] / r["prepare"]["wall_s"]
    return r


def prepare_module() -> tuple[str | None, str]:
    """The module of pyproject.toml's seq2seq-prepare script (else seq2seq.data.prepare), or None
    and why: its `python -m ... --help` must print Hydra's help."""
    script = re.search(r'seq2seq-prepare\s*=\s*"([\w.]+):', (ROOT / "pyproject.toml").read_text())
    module = script.group(1) if script else "seq2seq.data.prepare"
    cmd, env = [sys.executable, "-m", module, "--help"], child_env(False)
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if out.returncode == 0 and "Hydra" in out.stdout:
        return module, ""
    return None, f"python -m {module} --help: exit {out.returncode}, {out.stderr[-300:]!r}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="pairs, comma-separated")
    parser.add_argument("--work", type=Path, default=Path("/tmp/data_scale"), help="corpora, runs")
    parser.add_argument("--data", type=Path, default=multi30k_root(), help="Multi30k folder")
    parser.add_argument("--steps", type=int, default=50, help="training steps per run")
    parser.add_argument("--no-old", action="store_true", help="skip the old data path")
    parser.add_argument("--no-doc", action="store_true", help="skip docs and results/")
    parser.add_argument("--report", type=Path, help="only write docs/results from this JSON")
    parser.add_argument("--old-from", type=Path, help="the old path's figures from this JSON")
    parser.add_argument("--speed-repeats", type=int, default=3, help="speed runs of each path")
    parser.add_argument("--speed-size", type=int, default=1_000_000, help="pairs of those runs")
    for hidden in ("--tb-times", "--old-tokenize", "--model"):  # the child modes
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--generate", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.work, args.data = args.work.resolve(), args.data.resolve()
    return args


def main() -> None:
    args = parse_args()
    sys.argv[0] = str(Path(__file__).resolve())  # common.command() names it from the root
    if args.generate or args.tb_times or args.old_tokenize:  # a child mode
        if args.generate:
            generate(args.data, args.work, args.generate, SEED)
        elif args.tb_times:
            print(json.dumps(tb_times(Path(args.tb_times))))
        else:
            print(json.dumps(tokenize_old(Path(args.old_tokenize), Path(args.model))))
        return
    if args.report:  # a finished run's <work>/data_scale.json, written up again
        publish(json.loads(args.report.read_text()))
        return
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    args.prepare, args.new_missing = prepare_module()
    if args.prepare is None:
        say(f"new path unavailable: {args.new_missing}")
    old_commit = OLD_COMMIT if args.no_old else ensure_worktree()
    result: dict[str, Any] = {"old_commit": old_commit, "prepare_module": args.prepare}
    result.update(sizes=sizes, steps=args.steps, warm=min(10, args.steps // 5))
    result.update(mem_total_mb=mem_total_mb(), results=[])
    measured: Points = []
    for pairs in sizes:
        result["results"].append(run_size(pairs, args, measured))
        result["harness_peak_rss_mb"] = peak_rss_mb()  # a floor of every child's ru_maxrss
        (args.work / "data_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.speed_repeats and not args.no_old and args.prepare is not None:
        result["speed"] = speed_repeats(args)
        (args.work / "data_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(report(result))
    if not args.no_doc:
        publish(result)


def speed_repeats(args: argparse.Namespace) -> dict[str, Any]:
    """Training speed of both paths at --speed-size, --speed-repeats runs each, alternating
    which goes first: one run's steps/s varies with the batches its first steps draw."""
    pairs = args.speed_size
    corpus, _ = ensure_corpus(args.work, pairs, args.data)
    prepared = args.work / f"prepared-{pairs}"
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for rep in range(args.speed_repeats):
        for kind in ("old", "new") if rep % 2 == 0 else ("new", "old"):
            extra = [f"data.prepared={prepared}"] if kind == "new" else []
            runs[kind].append(train(kind, corpus, args, pairs, *extra))
    out: dict[str, Any] = {"pairs": pairs, "runs": runs}
    for kind, results in runs.items():
        for key in ("steps_per_s", "tgt_tokens_per_s"):
            values = [r[key] for r in results if isinstance(r.get(key), int | float)]
            if len(values) >= 2:
                out[f"{kind}_{key}"] = {
                    "mean": statistics.fmean(values),
                    "std": statistics.stdev(values),
                    "n": len(values),
                }
    return out


if __name__ == "__main__":
    main()
