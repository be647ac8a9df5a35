"""Cross-attention of one long test sentence under the best and the worst encoding of a sweep
trained short (make sweep-multi30k), as a PNG and in TensorBoard.

Usage:
    python scripts/attention_long.py --sweep multirun/pos_multi30k \\
        --report docs/positional/multi30k/comparison.csv --png docs/images/attention_long.png

The best and the worst encoding are those of highest and lowest mean BLEU on the long split in
the report's comparison.csv (compare_runs.py --length-by tokens; the all-lengths reference is
not an encoding of the sweep and is left out); their runs of --seed (default 1), or of the first
seed whose checkpoint is on disk (an archived run has none: scripts/sweep_archive.py), translate
the sentence with the settings they were tested with (best.pt). The sentence is the
first of the runs' first test split whose source has at least --min-tokens tokens (default 1.5x
the training cap: well past anything seen in training), so it is chosen by rule, not by look.
Each panel shows the decoder layers' cross-attention averaged (heads averaged too): a diagonal
that holds to the end means the model kept its place in the source. TensorBoard: the figure and
the texts go to <sweep>/attention_tb (tensorboard --logdir <sweep>/attention_tb).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import sacrebleu

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from seq2seq.decode.translator import Translation, Translator
from seq2seq.train.corpus import read_split

REFERENCE_SUFFIX = " (all lengths)"  # compare_runs.py --reference


def best_and_worst(report: Path) -> tuple[str, str]:
    """The encodings of highest and lowest mean long-split BLEU in the report's CSV."""
    with report.open(encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["split"].startswith("long")]
    if not rows:
        raise SystemExit(f"attention_long: {report} has no long split (--length-by tokens)")
    by_label: dict[str, list[float]] = {}
    for r in rows:
        if not r["encoding"].endswith(REFERENCE_SUFFIX):
            by_label.setdefault(r["encoding"], []).append(float(r["bleu"]))
    ranked = sorted(by_label, key=lambda lab: -statistics.fmean(by_label[lab]))
    return ranked[0], ranked[-1]


def run_folder(sweep: Path, report: Path, label: str, seed: int) -> Path:
    """The job folder of `label` with trainer.seed == seed, or else with the lowest seed, whose
    checkpoints/best.pt is on disk, from the report's rows."""
    with report.open(encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["encoding"] == label]
    seeds = sorted({r["seed"] for r in rows}, key=lambda s: (s != str(seed), int(s or 0)))
    for s in seeds:
        job = next(r for r in rows if r["seed"] == s)["run"].split("/", 1)[-1]
        if (sweep / job / "checkpoints" / "best.pt").is_file():
            return sweep / job
    raise SystemExit(
        f"attention_long: no run of {label} in {report} has checkpoints/best.pt under {sweep} "
        f"(seeds {', '.join(seeds)}): train one (make sweep-multi30k trains the missing runs)"
    )


def pick_sentence(translator: Translator, min_tokens: int) -> tuple[str, str, int]:
    """(source, reference, line number) of the first test sentence of at least min_tokens."""
    data = translator.cfg.data
    split = data.test[0]
    for number, (src, ref) in enumerate(read_split(data, split), start=1):
        if len(translator.src_tok.encode(src)) >= min_tokens:
            return src, ref, number
    raise SystemExit(f"attention_long: no {split} source has {min_tokens} tokens or more")


def tokens(tok: object, ids: list[int]) -> list[str]:
    return [tok.id_to_token(i) for i in ids] + ["</s>"]  # type: ignore[attr-defined]


def draw(panels: list[tuple[str, Translator, Translation, str]], src_ids: list[int], title: str):
    """One heatmap per (label, translator, translation, caption), side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(len(t.tokens) + 1 for _, _, t, _ in panels)
    width, height = 2.0 + 0.3 * (len(src_ids) + 1), 2.5 + 0.3 * rows
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), height), squeeze=False)
    for ax, (label, tr, hyp, caption) in zip(axes[0], panels, strict=True):
        weights = hyp.attention.mean(0).numpy()  # (T + 1, S + 1) layers averaged
        ax.imshow(weights, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(src_ids) + 1), tokens(tr.src_tok, src_ids), rotation=90, fontsize=8)
        ax.set_yticks(range(len(hyp.tokens) + 1), tokens(tr.tgt_tok, hyp.tokens), fontsize=8)
        ax.set_title(f"{label}\n{caption}", fontsize=9)
        ax.set_xlabel("source")
    axes[0][0].set_ylabel("target (its translation)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, required=True, help="the sweep's folder")
    parser.add_argument("--report", type=Path, required=True, help="its comparison.csv")
    parser.add_argument("--png", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--seed", type=int, default=1, help="the runs' trainer.seed")
    parser.add_argument("--min-tokens", type=int, help="default: 1.5x data.train_max_src_len")
    args = parser.parse_args(argv)
    best, worst = best_and_worst(args.report)
    folders = {lab: run_folder(args.sweep, args.report, lab, args.seed) for lab in (best, worst)}
    translators = {
        lab: Translator.from_checkpoint(f / "checkpoints" / "best.pt", "cpu")
        for lab, f in folders.items()
    }
    first = translators[best]
    cap = first.cfg.data.train_max_src_len
    src, ref, number = pick_sentence(first, args.min_tokens or (3 * cap + 1) // 2)
    src_ids = first.src_tok.encode(src)
    panels = []
    for rank, lab in (("best", best), ("worst", worst)):
        hyp = translators[lab].translate_nbest([src], attention=True)[0][0]
        bleu = sacrebleu.sentence_bleu(hyp.text, [ref]).score
        caption = f"{rank} on the long split; sentence BLEU {bleu:.1f}\n{hyp.text}"
        panels.append((lab, translators[lab], hyp, caption))
        print(f"{rank}: {lab} ({folders[lab].name}): {hyp.text}  [sentence BLEU {bleu:.1f}]")
    split = first.cfg.data.test[0]
    title = (
        f"{split} line {number}: {len(src_ids)} source tokens (trained on at most {cap})\n"
        f"source: {src}\nreference: {ref}"
    )
    fig = draw(panels, src_ids, title)
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=100, bbox_inches="tight")
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(args.sweep / "attention_tb")) as writer:
        writer.add_figure("cross_attention/long_sentence", fig)
        writer.add_text(
            "cross_attention/sentence",
            f"{title}\n\n" + "\n\n".join(f"{lab}: {hyp.text}" for lab, _, hyp, _ in panels),
        )
    print(f"wrote {args.png} and {args.sweep / 'attention_tb'} (source: {split} line {number})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
