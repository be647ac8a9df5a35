"""results.json's test scores against sacreBLEU recomputed from the files the run wrote. The run
learns a toy word-for-word translation far enough (test BLEU ~75) that a hypothesis file out of
step with its references, or scored with other settings, shows in the numbers; test_run.py's
end-to-end model is too short-trained for that (its BLEU is ~0)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import sacrebleu

from seq2seq.train.run import train
from tests.tiny_run import compose_train, tiny_overrides

WORDS = {
    "one": "eins",
    "two": "zwei",
    "three": "drei",
    "four": "vier",
    "five": "fünf",
    "six": "sechs",
    "seven": "sieben",
    "eight": "acht",
    "nine": "neun",
    "ten": "zehn",
    "house": "Haus",
    "dog": "Hund",
    "cat": "Katze",
    "tree": "Baum",
    "car": "Auto",
    "book": "Buch",
    "water": "Wasser",
    "sun": "Sonne",
    "moon": "Mond",
    "city": "Stadt",
}
SIZES = {"train": 2000, "valid": 30, "test": 40}


def write_word_for_word(folder: Path) -> Path:
    """2-7 random words and their German words, in order. The test references alone start with
    a capital letter, which the model never saw: its cased and lowercased BLEU differ."""
    folder.mkdir(parents=True)
    rng = random.Random(0)
    for split, n in SIZES.items():
        src, tgt = [], []
        for _ in range(n):
            words = [rng.choice(list(WORDS)) for _ in range(rng.randint(2, 7))]
            german = " ".join(WORDS[w] for w in words)
            src.append(" ".join(words))
            tgt.append(german[0].upper() + german[1:] if split == "test" else german)
        (folder / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (folder / f"{split}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 200-step run of a d_model=64 model on the toy data (seconds on one thread)."""
    root = tmp_path_factory.mktemp("results")
    extra = [
        "tokenizer=word",
        "model.d_model=64",
        "model.d_ff=128",
        "model.dropout=0.0",
        "optim.lr=0.01",
        "optim.warmup_steps=20",
        "trainer.max_steps=200",
        "trainer.valid_every=200",
        "trainer.max_tokens=512",
        "trainer.keep_last=0",
        "trainer.log_every=50",
    ]
    data = write_word_for_word(root / "data")
    train(compose_train(tiny_overrides(data, root / "cache", *extra)), root / "run")
    return root / "run"


def test_results_test_scores_are_sacrebleu_of_the_written_hypotheses(run_dir: Path) -> None:
    """Catches results.json scoring other text than test.hyp holds (another order, another
    detokenisation, references other than the split's file) or with other sacreBLEU settings
    (tokenizer, case): its BLEU (13a, cased), lowercased BLEU and chrF are those recomputed from
    test.hyp against test.de."""
    data = run_dir.parent / "data"
    scores = json.loads((run_dir / "results.json").read_text())["test"]["test"]
    hyps = (run_dir / "test.hyp").read_text(encoding="utf-8").splitlines()
    refs = (data / "test.de").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len(refs) == scores["n"] == SIZES["test"]
    bleu = sacrebleu.corpus_bleu(hyps, [refs]).score  # sacreBLEU's defaults: 13a, cased
    lowercased = sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score
    assert scores["bleu"] == round(bleu, 2)
    assert scores["bleu_lc"] == round(lowercased, 2)
    assert scores["chrf"] == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|")
    assert scores["bleu_lc_signature"].startswith("nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|")
    # what makes the comparison able to fail: the model translates (a line out of step with
    # its reference scores far lower), and case matters (the capitalised references)
    assert bleu > 30
    assert sacrebleu.corpus_bleu(hyps[1:] + hyps[:1], [refs]).score < bleu / 2
    assert lowercased > bleu + 5
