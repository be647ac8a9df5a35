"""Subword regularization (seq2seq/data/subword_sampling.py, tokenizer.sampling): off, training
reads the ids of today's deterministic encode; on, each epoch draws other segmentations of the
same text, the same ones for the same (seed, epoch, pair) however they are read and whichever
lengths the epoch is planned on, that decode to the text itself; planned on the sampled
lengths, every batch fits the token budget; validation, test and translation never sample."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from seq2seq.config.schema import SubwordSamplingConfig
from seq2seq.data.batching import Batch, fit_budget
from seq2seq.data.epochs import TrainData
from seq2seq.data.subword_sampling import Sampling, SubwordSampler, pair_seeds, sampling_of
from seq2seq.data.tokenizer import EOS_ID, PAD_ID
from seq2seq.decode.translator import Translator
from seq2seq.errors import ConfigError
from seq2seq.train.build import build_trainer
from seq2seq.train.corpus import Corpus, load_corpus
from tests.tiny_run import compose_train, tiny_overrides, write_slice

# strong enough that nearly every pair of the numbers data changes from epoch to epoch
SETTINGS = {
    "bpe": ["tokenizer=bpe", "tokenizer.sampling.bpe_dropout=0.3"],
    "unigram": ["tokenizer=unigram", "tokenizer.sampling.unigram_alpha=0.2"],
}
PLANS = ["sampled", "prepared"]  # tokenizer.sampling.plan
Rows = dict[int, tuple[list[int], list[int]]]  # pair -> (source ids, target ids), no specials


@dataclass
class Setup:
    root: Path
    data: Path

    def corpus(self, *extra: str) -> Corpus:
        """The tiny corpus with two vocabularies (so that a side's ids decode only with its own
        tokenizer) and `extra` overrides."""
        args = tiny_overrides(
            self.data,
            self.root / "cache",
            "tokenizer.joint=false",
            "model.share_embeddings=false",
            *extra,
        )
        return load_corpus(compose_train(args))

    def lines(self, lang: str) -> list[str]:
        return (self.data / f"train.{lang}").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("sampling")
    return Setup(root, write_slice(root / "data"))


def content(row: list[int]) -> list[int]:
    """A padded row's ids before its EOS."""
    ids = [i for i in row if i != PAD_ID]
    assert ids[-1] == EOS_ID
    return ids[:-1]


def rows_of(batch: Batch) -> Rows:
    src, tgt = batch.src.tolist(), batch.tgt_out.tolist()
    return {int(i): (content(s), content(t)) for i, s, t in zip(batch.index.tolist(), src, tgt)}


def epoch_rows(train: TrainData, epoch: int, reverse: bool = False) -> Rows:
    """Every pair's ids as epoch `epoch` trains on them (its batches read in reverse order when
    asked: a resumed run starts in the middle)."""
    refs = train.epoch_batches(epoch)
    out: Rows = {}
    for ref in reversed(refs) if reverse else refs:
        out.update(rows_of(train.read(ref)))
    assert len(out) == len(train)
    return out


def test_off_trains_on_the_ids_of_the_deterministic_encode(setup: Setup) -> None:
    corpus = setup.corpus("tokenizer=bpe")
    assert corpus.train.sampler is None
    src_tok, tgt_tok = corpus.tokenizers
    src_lines, tgt_lines = setup.lines("en"), setup.lines("de")
    assert len(corpus.train) == len(src_lines)  # no pair dropped: pair i is line i
    for epoch in (0, 1):
        for ref in corpus.train.epoch_batches(epoch):
            batch = corpus.train.collate(ref)
            assert fit_budget(batch, corpus.train.max_tokens) == [batch]
            for i, (src, tgt) in rows_of(batch).items():
                assert src == src_tok.encode(src_lines[i])
                assert tgt == tgt_tok.encode(tgt_lines[i])


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_each_epoch_samples_other_segmentations_of_the_same_text(
    setup: Setup, kind: str, plan: str
) -> None:
    corpus = setup.corpus(*SETTINGS[kind], f"tokenizer.sampling.plan={plan}")
    train, (src_tok, tgt_tok) = corpus.train, corpus.tokenizers
    lines = zip(setup.lines("en"), setup.lines("de"), strict=True)
    plain = {i: (src_tok.encode(s), tgt_tok.encode(t)) for i, (s, t) in enumerate(lines)}
    epochs = [epoch_rows(train, e) for e in range(3)]
    for rows in epochs:
        changed = sum(rows[i] != plain[i] for i in rows)
        # sampled, not the deterministic segmentation (which changes none); a half, not more:
        # the unigram model of this tiny corpus, and so how many of its pairs have a second
        # segmentation, differs between sentencepiece versions (0.2.3: 122 of 150; 0.2.2: 118)
        assert changed > 0.5 * len(rows)
        for i, (src, tgt) in rows.items():  # ... of the same text
            assert src_tok.decode(src) == src_tok.decode(plain[i][0])
            assert tgt_tok.decode(tgt) == tgt_tok.decode(plain[i][1])
            assert max(len(src), len(tgt)) <= train.max_len
    for a, b in ((0, 1), (1, 2), (0, 2)):
        differ = sum(epochs[a][i] != epochs[b][i] for i in epochs[a])
        assert differ > 0.8 * len(epochs[a]), (a, b)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_the_same_seed_and_epoch_draw_the_same_segmentations(
    setup: Setup, kind: str, plan: str
) -> None:
    """Whatever reads them (another process's corpus, the batches in another order, the
    prefetch thread), and a pair alone as in its batch; another seed draws others."""
    settings = [*SETTINGS[kind], f"tokenizer.sampling.plan={plan}"]
    first, again = setup.corpus(*settings), setup.corpus(*settings)
    for epoch in (0, 1):
        want = epoch_rows(first.train, epoch)
        assert epoch_rows(again.train, epoch, reverse=True) == want
        refs = again.train.epoch_batches(epoch)
        again.train.prefetch(refs[:3])  # read in the background thread
        for ref in refs[:3]:
            got = rows_of(again.train.collate(ref))
            assert got == {i: want[i] for i in got}
    sampler = first.train.sampler
    assert sampler is not None
    batch = rows_of(first.train.read(first.train.epoch_batches(0)[0]))
    for i, row in batch.items():  # the draw of a pair does not depend on the others drawn
        src, tgt = first.train.corpora[0].row(i)  # its prepared (deterministic) ids
        assert sampler.resample(0, np.array([i]), [(src.tolist(), tgt.tolist())]) == [row]
    other = setup.corpus(*settings, "trainer.seed=2")
    seeded = epoch_rows(other.train, 0)
    want = epoch_rows(first.train, 0)
    assert sum(seeded[i] != want[i] for i in want) > 0.8 * len(want)


def test_validation_test_and_translation_never_sample(setup: Setup, tmp_path: Path) -> None:
    """The evaluation splits hold the deterministic ids, the tokenizers still encode
    deterministically after training batches were sampled, and a checkpoint trained with
    sampling translates from deterministic ids."""
    args = tiny_overrides(
        setup.data,
        setup.root / "cache",
        *SETTINGS["bpe"],
        "trainer.max_steps=2",
        "trainer.valid_every=2",
    )
    cfg = compose_train(args)
    trainer = build_trainer(cfg, tmp_path)
    src_tok, tgt_tok = trainer.src_tok, trainer.tgt_tok
    want = {name: split.src_ids for name, split in trainer.splits.items()}
    trainer.fit()  # sampled training batches, then a validation and a checkpoint
    trainer.close()
    for name, split in trainer.splits.items():
        assert split.src_ids == [src_tok.encode(t) for t in split.src_text], name
        assert split.tgt_ids == [tgt_tok.encode(t) for t in split.tgt_text], name
        assert split.src_ids == want[name]
        assert src_tok.encode_batch(split.src_text) == split.src_ids
    texts = trainer.splits["test"].src_text[:5]
    translator = Translator.from_checkpoint(tmp_path / "checkpoints" / "last.pt", device="cpu")
    assert translator.src_tok.encode_batch(texts) == [src_tok.encode(t) for t in texts]
    assert translator.translate(texts) == translator.translate(texts)


def test_sampled_batches_are_cut_to_the_token_budget(setup: Setup) -> None:
    """plan=prepared: sampled segmentations are longer, the batches planned on the prepared
    lengths no longer fit the budget, and fit_budget cuts them into passes that do, holding
    each pair once."""
    corpus = setup.corpus(
        *SETTINGS["bpe"], "trainer.max_tokens=128", "tokenizer.sampling.plan=prepared"
    )
    over = 0
    for ref in corpus.train.epoch_batches(0):
        batch = corpus.train.collate(ref)
        parts = fit_budget(batch, 128)
        over += len(parts) > 1
        assert sorted(i for p in parts for i in p.index.tolist()) == sorted(batch.index.tolist())
        for part in parts:
            rows = rows_of(part)
            width = max(max(len(s), len(t)) + 1 for s, t in rows.values())
            assert len(rows) == 1 or len(rows) * (width + 1) <= 128
            assert rows == {i: rows_of(batch)[i] for i in rows}
    assert over > 0  # the test exercises the cut


def test_seeds_are_a_function_of_seed_epoch_and_pair() -> None:
    pairs = np.arange(1000)
    seeds = pair_seeds(1, 0, pairs)  # (1000, 2)
    assert seeds.shape == (1000, 2)
    assert int(seeds.max()) < 2**32 - 1  # -1 would ask sentencepiece for a random seed
    assert len({int(s) for s in seeds.flatten()}) > 1990
    assert np.array_equal(pair_seeds(1, 0, pairs[::-1]), seeds[::-1])
    assert np.array_equal(pair_seeds(1, 0, pairs[5:9]), seeds[5:9])
    for other in (pair_seeds(2, 0, pairs), pair_seeds(1, 1, pairs)):
        assert (other != seeds).mean() > 0.99


def test_settings_and_refusals(setup: Setup) -> None:
    assert sampling_of(SubwordSamplingConfig(), "bpe") is None
    assert sampling_of(SubwordSamplingConfig(bpe_dropout=0.1), "bpe") == Sampling(0.1, -1)
    got = sampling_of(SubwordSamplingConfig(unigram_alpha=0.3, unigram_nbest=8), "unigram")
    assert got == Sampling(0.3, 8)
    with pytest.raises(ConfigError, match=r"tokenizer\.sampling\.bpe_dropout=0\.1"):
        sampling_of(SubwordSamplingConfig(bpe_dropout=0.1), "unigram")  # a fine-tune's kind
    word = setup.corpus("tokenizer=word", "tokenizer.vocab_size=500").tokenizers
    with pytest.raises(ConfigError, match="SentencePiece"):
        SubwordSampler(word, Sampling(0.1, -1), 1, (64, 64))


def test_threads_draw_independently(setup: Setup) -> None:
    """The prefetch thread and the main thread seed their own generators: drawing in both at
    once gives each the draws it would get alone."""
    corpus = setup.corpus(*SETTINGS["unigram"], "tokenizer.sampling.plan=prepared")
    train = corpus.train  # sampled as batches are read
    refs = train.epoch_batches(0)
    want = [rows_of(train.read(r)) for r in refs]
    got: dict[int, list[Rows]] = {0: [], 1: []}

    def read_all(k: int) -> None:
        for _ in range(3):
            got[k] = [rows_of(train.read(r)) for r in refs]

    threads = [threading.Thread(target=read_all, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] == want
    assert got[1] == want


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_a_plan_on_the_sampled_lengths_fits_the_budget(setup: Setup, kind: str) -> None:
    """plan=sampled: each epoch trains on the segmentations plan=prepared draws, every pair
    once, but every batch fits trainer.max_tokens as planned (one pass a step, its share of
    real tokens the one logged), and, the sampled text being longer than the deterministic
    encode, at least as many batches as plan=prepared makes."""
    budget = "trainer.max_tokens=256"
    corpus = setup.corpus(*SETTINGS[kind], budget)
    on_sampled, (src_tok, tgt_tok) = corpus.train, corpus.tokenizers
    on_prepared = setup.corpus(*SETTINGS[kind], budget, "tokenizer.sampling.plan=prepared").train
    lines = zip(setup.lines("en"), setup.lines("de"), strict=True)
    plain = sum(len(src_tok.encode(s)) + len(tgt_tok.encode(t)) for s, t in lines)
    for epoch in (0, 1):
        rows = epoch_rows(on_sampled, epoch)
        assert rows == epoch_rows(on_prepared, epoch)
        assert sum(len(src) + len(tgt) for src, tgt in rows.values()) > plain
        planned = on_sampled.epoch_padding(epoch)
        real, padded = 0, 0
        for ref in on_sampled.epoch_batches(epoch):
            passes = on_sampled.passes(ref)
            assert len(passes) == 1
            src, tgt = passes[0].src, passes[0].tgt_out
            assert src.shape[0] * (max(src.shape[1], tgt.shape[1]) + 1) <= 256
            real += int(src.ne(PAD_ID).sum() + tgt.ne(PAD_ID).sum())
            padded += src.numel() + tgt.numel()
        assert planned["padding_efficiency"] == pytest.approx(real / padded)
        cut = [p for r in on_prepared.epoch_batches(epoch) for p in on_prepared.passes(r)]
        assert sum(int(p.tgt_out.ne(PAD_ID).sum()) for p in cut) == int(  # the same tokens
            sum(
                on_sampled.collate(r).tgt_out.ne(PAD_ID).sum()
                for r in on_sampled.epoch_batches(epoch)
            )
        )
        assert len(on_sampled.epoch_batches(epoch)) >= len(on_prepared.epoch_batches(epoch))


def test_the_next_epoch_drawn_in_the_background_is_the_one_drawn_on_demand(setup: Setup) -> None:
    """Planning epoch e starts drawing epoch e + 1 in the sampling thread; a run resumed at
    e + 1 (nothing drawn ahead) plans the same batches of the same segmentations."""
    straight = setup.corpus(*SETTINGS["bpe"]).train
    epoch_rows(straight, 0)
    assert straight.next_epoch is not None
    assert straight.next_epoch[0] == 1
    resumed = setup.corpus(*SETTINGS["bpe"]).train
    assert resumed.epoch_batches(1) == straight.epoch_batches(1)
    for ref in straight.epoch_batches(1):
        assert rows_of(straight.read(ref)) == rows_of(resumed.read(ref))
    straight.close()
    resumed.close()


def test_sampled_plan_with_fixed_shapes_pads_every_batch_to_a_bucket(setup: Setup) -> None:
    """trainer.batch_shapes=fixed (compile's shapes) under plan=sampled: the buckets are fitted
    on the prepared lengths and the sampled ones are longer, yet every step is one pass padded
    to one of the buckets' lengths, holding the epoch's sampled rows."""
    fixed = ["trainer.batch_shapes=fixed", "trainer.shape_buckets=4", "trainer.max_tokens=512"]
    train = setup.corpus(*SETTINGS["bpe"], *fixed).train
    assert train.buckets is not None
    lengths = {(s, t) for _, s, t in train.buckets.shapes()}
    rows: Rows = {}
    for ref in train.epoch_batches(0):
        passes = train.passes(ref)
        assert len(passes) == 1
        batch = passes[0]
        assert (batch.src.shape[1], batch.tgt_out.shape[1]) in lengths
        real = batch.index.ge(0)  # (R,) the filler rows have index -1
        rows.update(
            rows_of(
                Batch(batch.src[real], batch.tgt_in[real], batch.tgt_out[real], batch.index[real])
            )
        )
    assert rows == epoch_rows(setup.corpus(*SETTINGS["bpe"], "trainer.max_tokens=512").train, 0)
