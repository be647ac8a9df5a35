"""Results of benchmarks/data_scale.py: benchmarks/results/data_scale.json and its
docs/BENCHMARKS.md section. Every number printed comes from the run's own results; the fixed text
only says what was done. Issue #17's targets are checked against those figures."""

from __future__ import annotations

from typing import Any

from common import update_doc, write_json

# the run's settings the report states (benchmarks/data_scale.py measures with them)
SEED = 17  # the synthetic corpora's
SAMPLE_S = 0.5  # interval of the PSS samples of a child's processes
DISTURBED = 0.1  # other processes' CPU seconds per wall second above which a run is flagged


def label(n: int) -> str:
    """A corpus size as the report writes it: 29k, 1M."""
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


def cell(part: dict[str, Any], key: str, spec: str = ",.0f", scale: float = 1.0) -> str:
    if "skipped" in part or "error" in part:
        return "skipped" if "skipped" in part else "failed"
    value = part.get(key)
    return format(value * scale, spec) if isinstance(value, int | float) else "-"


PREP_TABLE = (
    "| pairs | corpus text (MB) | prepare (s) | prepare pairs/s | prepare peak RSS (MB) "
    "| prepare PSS, all processes (MB) | prepared on disk (MB) | prepare's tokenize pass "
    "pairs/s | old read + tokenize pairs/s | prepare / old |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


RUN_TABLE = (
    '| pairs | path | to "model:" line (s) | to step 1 (s) | peak RSS (MB) '
    "| PSS, all processes (MB) | steps/s | target tokens/s |\n|---|---|---|---|---|---|---|---|"
)


def rows(r: dict[str, Any]) -> tuple[str, list[str], list[str]]:
    """One size's row of the preparation table, its rows of the training table, its notes."""
    p, n = r["prepare"], label(r["pairs"])
    prep = (
        f"| {n} | {sum(r['corpus']['bytes'].values()) / 2**20:,.0f} | "
        f"{cell(p, 'wall_s', ',.1f')} | {cell(p, 'pairs_per_s')} | {cell(p, 'peak_rss_mb')} | "
        f"{cell(p, 'peak_tree_pss_mb')} | {cell(p, 'disk_bytes', ',.0f', 2**-20)} | "
        f"{cell(p, 'tokenize_pass_pairs_per_s')} | {cell(r['old_tokenize'], 'pairs_per_s')} | "
        f"{cell(r, 'prepare_vs_old_tokenize', '.2f')} |"
    )
    runs = [
        f"| {n} | {kind} | {cell(r[kind], 'to_model_line_s', ',.1f')} | "
        f"{cell(r[kind], 'to_step1_s', ',.1f')} | {cell(r[kind], 'peak_rss_mb')} | "
        f"{cell(r[kind], 'peak_tree_pss_mb')} | {cell(r[kind], 'steps_per_s', '.2f')} | "
        f"{cell(r[kind], 'tgt_tokens_per_s')} |"
        for kind in ("old", "new")
    ]
    notes: list[str] = []
    if "from" in r["old"]:
        notes.append(f"- {n} old: figures of the run in {r['old']['from']} (the old code is fixed)")
    for name in ("prepare", "new", "old", "old_tokenize"):
        part = r[name]
        if "skipped" in part or "error" in part:
            notes.append(f"- {n} {name}: {part.get('skipped') or part.get('error')}")
        elif (other := part.get("other_cpu_s", 0)) > DISTURBED * part.get("wall_s", 0):
            notes.append(f"- {n} {name}: disturbed, other processes used {other:.1f} CPU s")
    return prep, runs, notes


def ratio(a: Any, b: Any) -> float | None:
    ok = isinstance(a, int | float) and isinstance(b, int | float) and b
    return a / b if ok else None


def targets(result: dict[str, Any]) -> list[str]:
    """Issue #17's targets, each checked against this run's figures."""
    runs = [r for r in result["results"] if "peak_rss_mb" in r["new"]]
    if not runs:
        return []
    base, lines = runs[0], []
    for r in runs[1:]:
        grow = ratio(r["new"]["peak_rss_mb"], base["new"]["peak_rss_mb"])
        if grow is not None:
            verdict = "met" if grow <= 1.10 else "NOT met"
            lines.append(
                f"- training peak RSS at {label(r['pairs'])} pairs / at {label(base['pairs'])}: "
                f"{grow:.3f} (target <= 1.10: {verdict})"
            )
    last = runs[-1]["new"].get("to_step1_s")
    if isinstance(last, int | float):
        verdict = "met" if last < 10 else "NOT met"
        lines.append(
            f"- start to step 1 on the prepared corpus at {label(runs[-1]['pairs'])} pairs: "
            f"{last:.1f} s (target < 10 s: {verdict})"
        )
    for r in runs:
        for key, what in (
            ("tokenize_pass_vs_old_tokenize", "prepare's tokenize pass / old read + tokenize"),
            ("prepare_vs_old_tokenize", "prepare (whole process) / old read + tokenize"),
            ("prepare_vs_old_start", "prepare (whole process) / old start to the model line"),
        ):
            speed = r.get(key)
            if isinstance(speed, int | float):
                verdict = "met" if speed >= 2 else "NOT met"
                lines.append(
                    f"- {what}, speed, at {label(r['pairs'])}: {speed:.2f}x "
                    f"(target >= 2x: {verdict})"
                )
        steps = ratio(r["new"].get("steps_per_s"), r["old"].get("steps_per_s"))
        if steps is not None:
            lines.append(f"- steps/s new / old at {label(r['pairs'])}: {steps:.2f}")
    return lines


def report(result: dict[str, Any]) -> str:
    """The Markdown body of the docs/BENCHMARKS.md section, every number from `result`."""
    prep, runs, notes = [PREP_TABLE], [RUN_TABLE], list[str]()
    for r in result["results"]:
        one, two, three = rows(r)
        prep, runs, notes = [*prep, one], runs + two, notes + three
    return (
        f"Synthetic corpora: each pair is the first half of a random Multi30k en-de training pair "
        f"and the second half of another (halves of the words; seed {SEED}). New: "
        "`seq2seq-prepare`, then training with data.prepared; old: the same training at commit "
        f"{result['old_commit'][:7]}, which reads, trains the tokenizer on and tokenizes every "
        "line at start. Tokenizer caches emptied first. prepare pairs/s: its whole process; old "
        "read + tokenize: read_parallel and encode_batch of both sides alone (prepared model). "
        f"Training: model=tiny, fp32, <= 4096 tokens a batch, {result['steps']} steps, from the "
        "launch; peak RSS: wait4's ru_maxrss (the largest process); PSS: all processes, sampled "
        f"every {SAMPLE_S} s; steps/s and target tokens/s over steps {result['warm'] + 1}.."
        f"{result['steps']} (the two paths batch differently).\n\n"
        + "\n".join(prep)
        + "\n\n"
        + "\n".join(runs)
        + ("\n\nSkipped, failed or disturbed:\n\n" + "\n".join(notes) if notes else "")
        + ("\n\n" + "\n".join(speed_lines(result)) if speed_lines(result) else "")
        + ("\n\nTargets:\n\n" + "\n".join(targets(result)) if targets(result) else "")
        + "\n"
    )


def speed_lines(result: dict[str, Any]) -> list[str]:
    """The repeated speed runs as report lines."""
    sp = result.get("speed")
    if not sp or "new_steps_per_s" not in sp or "old_steps_per_s" not in sp:
        return []
    lines = [
        f"Training speed at {label(sp['pairs'])} pairs, {sp['new_steps_per_s']['n']} runs "
        f"each (alternating), mean ± std:",
        "",
    ]
    for kind in ("old", "new"):
        a, b = sp[f"{kind}_steps_per_s"], sp[f"{kind}_tgt_tokens_per_s"]
        lines.append(
            f"- {kind}: {a['mean']:.2f} ± {a['std']:.2f} steps/s, "
            f"{b['mean']:,.0f} ± {b['std']:,.0f} target tokens/s"
        )
    ratio = sp["new_steps_per_s"]["mean"] / sp["old_steps_per_s"]["mean"]
    lines.append(f"- new / old, steps/s: {ratio:.2f}")
    return lines


def publish(result: dict[str, Any]) -> None:
    """benchmarks/results/data_scale.json and the docs/BENCHMARKS.md section."""
    write_json("data_scale", result)
    update_doc(
        "data_scale", "Data pipeline at scale: in-memory vs prepared (issue #17)", report(result)
    )
