"""Does a run's choice of checkpoint hold on sentences it was not chosen on? A check on the
validation set alone (docs/RESULTS.md, runs 51-55).

Until runs 51-55 decided it, a run with trainer.average_last took average.pt only where its
validation score beat best.pt's; seq2seq/train/testing.py keeps that rule for runs stopped early,
and a run that made its planned steps now takes the average. best.pt's score is the highest of
the run's validations, picked on the same sentences, so it is optimistic. This script translates
the validation set greedily (as training validates) with each kept checkpoint (step_*.pt,
best.pt) and average.pt, then cuts the sentences into random halves A and B many times: on A it
picks the best single checkpoint and applies the validation rule; on B it scores them against
always taking the average.

Usage:
    python scripts/choice_check.py RUN_DIR... --src val.en.gz --ref val.de.gz [--splits 1000]
    python scripts/choice_check.py RUN_DIR...   # the runs' kept reports, summed up over runs

Translations are kept in RUN_DIR/choice_check/<checkpoint>.txt (a rerun reuses them) and the
summary in RUN_DIR/choice_check/report.json. BLEU is sacreBLEU's, cased, as validation scores.
The figures over splits are a spread (the halves share sentences), not a test. The test is over
runs (independent seeds, one figure each): with three runs or more, a one-sample Student t-test
of each run's mean "rule minus always the average" and "picked single minus the average" against
zero, Holm-corrected over the two. Runs of other language pairs are checked one command each
(their own --src/--ref) and summed up together by a last command without --src/--ref.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sacrebleu.metrics.bleu import BLEU

from seq2seq.data.text import read_lines
from seq2seq.data.tokenizer import write_atomic
from seq2seq.errors import UserError
from seq2seq.evaluation.stats import holm, student_t_two_sided_p
from seq2seq.train.checkpoint import step_checkpoints

OUT = "choice_check"
MIN_RUNS = 3  # fewer runs than this are summed up without a test
TESTED = {
    "rule_minus_average_on_b": "the run's rule minus always the average",
    "single_minus_average_on_b": "the single picked on A minus the average",
}
SCORER = BLEU()  # sacreBLEU's defaults: cased, 13a, as validation scores


def candidates(run: Path) -> list[Path]:
    """The run's kept single checkpoints (step_*.pt by step, then best.pt) and average.pt last."""
    ckpts = run / "checkpoints"
    found = step_checkpoints(ckpts) + [
        p for p in (ckpts / "best.pt", ckpts / "average.pt") if p.exists()
    ]
    if not (ckpts / "average.pt").exists() or len(found) < 2:
        raise UserError(
            f"{ckpts}: needs average.pt and at least one single checkpoint (a run trained with "
            "trainer.average_last > 0 that has finished)"
        )
    return found


def translations(ckpt: Path, sources: list[str], out: Path) -> list[str]:
    """ckpt's greedy translations of `sources`, read from out/<name>.txt when it is there."""
    path = out / f"{ckpt.stem}.txt"
    if not path.exists():
        from seq2seq.decode.translator import Translator

        hyps = Translator.from_checkpoint(str(ckpt), device="cpu").translate(
            sources, method="greedy"
        )
        write_atomic(path, "".join(h + "\n" for h in hyps).encode("utf-8"))
    hyps = path.read_text(encoding="utf-8").splitlines()
    if len(hyps) != len(sources):
        raise UserError(f"{path}: {len(hyps)} lines for {len(sources)} sources; delete it to redo")
    return hyps


def sentence_stats(hyps: list[str], refs: list[str]) -> np.ndarray:
    """BLEU's sufficient statistics of each sentence (N, 10): sums of rows score a subset."""
    stats = SCORER._extract_corpus_statistics(hyps, [refs])  # sacreBLEU's own, as its bootstrap
    return np.asarray(stats, dtype=np.float64)


def bleu_of(stats: np.ndarray) -> float:
    """Corpus BLEU of summed statistics (10,)."""
    return float(SCORER._compute_score_from_stats([int(x) for x in stats]).score)


def split_half(
    singles: np.ndarray,
    average: np.ndarray,
    splits: int,
    seed: int,
    score: Callable[[np.ndarray], float] = bleu_of,
) -> dict[str, Any]:
    """singles (M, N, 10) and average (N, 10) statistics; `splits` random halvings. Returns the
    means and spreads over the splits of: the single picked on A minus the average, on B; the
    rule's choice (the average only where it is strictly better on A) minus the average, on B;
    and each choice's drop from A to B."""
    rng = np.random.default_rng(seed)
    n = average.shape[0]
    rows = []
    for _ in range(splits):
        in_a = rng.permutation(n) < n // 2  # (N,)
        on_a = [score(s[in_a].sum(0)) for s in singles]  # (M,)
        pick = int(np.argmax(on_a))
        single_b = score(singles[pick][~in_a].sum(0))
        avg_a, avg_b = score(average[in_a].sum(0)), score(average[~in_a].sum(0))
        rule_b = avg_b if avg_a > on_a[pick] else single_b
        rows.append(
            (
                single_b - avg_b,
                rule_b - avg_b,
                avg_a <= on_a[pick],
                on_a[pick] - single_b,
                avg_a - avg_b,
            )
        )
    r = np.array(rows, dtype=np.float64)  # (splits, 5)
    return {
        "splits": splits,
        "seed": seed,
        "single_minus_average_on_b": {"mean": r[:, 0].mean(), "std": r[:, 0].std()},
        "single_ahead_share": float(np.mean(r[:, 0] > 0)),
        "rule_minus_average_on_b": {"mean": r[:, 1].mean(), "std": r[:, 1].std()},
        "rule_picks_single_share": float(r[:, 2].mean()),
        "single_drop_a_to_b": float(r[:, 3].mean()),
        "average_drop_a_to_b": float(r[:, 4].mean()),
    }


def check(run: Path, src: Path, ref: Path, splits: int, seed: int) -> dict[str, Any]:
    """Translate, score and split; the report (also written to RUN_DIR/choice_check)."""
    sources, refs = read_lines(src), read_lines(ref)
    if len(sources) != len(refs):
        raise UserError(
            f"{src} has {len(sources)} lines and {ref} {len(refs)}: give one split's pair"
        )
    out = run / OUT
    out.mkdir(exist_ok=True)
    ckpts = candidates(run)
    stats = [sentence_stats(translations(c, sources, out), refs) for c in ckpts]
    report = {
        "run": str(run),
        "full_set_bleu": {c.stem: bleu_of(s.sum(0)) for c, s in zip(ckpts, stats, strict=True)},
        **split_half(np.stack(stats[:-1]), stats[-1], splits, seed),
    }
    (out / "report.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    return report


def kept_report(run: Path) -> dict[str, Any]:
    """The report a former check left in RUN_DIR/choice_check/report.json."""
    path = run / OUT / "report.json"
    if not path.exists():
        raise UserError(f"{path}: no report; check the run first with --src and --ref")
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def over_runs(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each run's mean on B of TESTED's differences, and with MIN_RUNS runs or more that differ a
    one-sample t-test of them against zero (df = runs - 1), Holm-corrected over those tested."""
    out: dict[str, Any] = {"runs": [r["run"] for r in reports]}
    tested = []
    for key in TESTED:
        x = np.array([r[key]["mean"] for r in reports], dtype=np.float64)  # (runs,)
        row: dict[str, Any] = {"per_run": x.tolist(), "mean": float(x.mean())}
        sd = float(x.std(ddof=1)) if len(x) >= MIN_RUNS else 0.0
        if sd > 0:  # runs all equal (a rule that never picks the single: 0 each) test nothing
            t = float(x.mean()) / (sd / np.sqrt(len(x)))
            row.update(sd=sd, t=t, df=len(x) - 1, p=student_t_two_sided_p(t, len(x) - 1))
            row["below_zero"] = int((x < 0).sum())
            tested.append(key)
        out[key] = row
    adjusted = holm([out[key]["p"] for key in tested])
    for key, p_holm in zip(tested, adjusted, strict=True):
        out[key]["p_holm"] = p_holm
    return out


def render_over_runs(summary: dict[str, Any]) -> str:
    """The over-runs summary as a few lines of text."""
    n = len(summary["runs"])
    lines = [f"over {n} runs (each run's mean on B; a test needs {MIN_RUNS} runs or more):"]
    tested = sum("p" in summary[key] for key in TESTED)
    for key, words in TESTED.items():
        row = summary[key]
        per_run = ", ".join(f"{v:+.2f}" for v in row["per_run"])
        line = f"  {words}: mean {row['mean']:+.2f} ({per_run})"
        if "p" in row:
            line += (
                f"; below zero in {row['below_zero']} of {n}; one-sample t-test t={row['t']:.2f},"
                f" df={row['df']}, p={row['p']:.3g}, Holm over {tested}: {row['p_holm']:.3g}"
            )
        elif n >= MIN_RUNS:
            line += "; the same in every run: no test"
        lines.append(line)
    return "\n".join(lines)


def render(report: dict[str, Any]) -> str:
    """The report as a few lines of text."""
    full = ", ".join(f"{k} {v:.2f}" for k, v in report["full_set_bleu"].items())
    single, rule = report["single_minus_average_on_b"], report["rule_minus_average_on_b"]
    return "\n".join(
        [
            f"{report['run']}: greedy BLEU on the whole set: {full}",
            f"over {report['splits']} random halvings (A picks, B scores; spread, not a test):",
            f"  single picked on A minus the average, on B: {single['mean']:+.2f} ± "
            f"{single['std']:.2f} (the single ahead in {report['single_ahead_share']:.0%})",
            f"  the run's rule minus always the average, on B: {rule['mean']:+.2f} ± "
            f"{rule['std']:.2f} (the rule picks the single in "
            f"{report['rule_picks_single_share']:.0%})",
            f"  drop from A to B: the picked single {report['single_drop_a_to_b']:+.2f}, "
            f"the average {report['average_drop_a_to_b']:+.2f}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run folders (with checkpoints/)")
    p.add_argument(
        "--src",
        type=Path,
        help="validation sources (plain or .gz); without --src "
        "and --ref the runs' kept reports are summed up",
    )
    p.add_argument("--ref", type=Path, help="validation references")
    p.add_argument("--splits", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        if (args.src is None) != (args.ref is None):
            raise UserError("give both --src and --ref (to check the runs), or neither (to sum up)")
        reports = []
        for run in args.runs:
            if args.src is None:
                reports.append(kept_report(run))
            else:
                reports.append(check(run, args.src, args.ref, args.splits, args.seed))
            print(render(reports[-1]))
        if len(reports) > 1:
            print(render_over_runs(over_runs(reports)))
    except UserError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
