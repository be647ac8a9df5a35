"""Tests for seq2seq.data.tokenizer: special ids, round trips, state, cache and property tests."""

from __future__ import annotations

import io
import pickle
import random
import string
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seq2seq.data import tokenizer as tok
from seq2seq.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    SentencePieceTokenizer,
    Tokenizer,
    VocabTokenizer,
    build_tokenizers,
    build_vocab,
    tokenizer_from_state,
)

KINDS = ("bpe", "unigram", "word", "char")
UNK_PIECE = "\u2047"
# Characters the char-tokenizer property test draws from; all occur in the training texts.
CHAR_ALPHABET = string.ascii_letters + string.digits + " .,;:!?'-\n\tÄäöüßéèç"


def _make_words(rng: random.Random, letters: str, count: int) -> list[str]:
    return ["".join(rng.choices(letters, k=rng.randint(1, 8))) for _ in range(count)]


def _make_corpus(rng: random.Random, words: Sequence[str], lines: int) -> list[str]:
    return [" ".join(rng.choices(words, k=rng.randint(3, 12))) for _ in range(lines)]


_RNG = random.Random(1234)
# "Source" words use every ASCII letter (the bpe property test needs them all in the vocabulary);
# "target" words use a disjoint alphabet, so separate vocabularies must differ.
SRC_WORDS = [*string.ascii_letters, *_make_words(_RNG, string.ascii_letters, 150)]
TGT_WORDS = _make_words(_RNG, "αβγδεζηθικλμνξοπρστυφχψω", 150)
SRC_TEXTS = [*_make_corpus(_RNG, SRC_WORDS, 300), " ".join(SRC_WORDS), CHAR_ALPHABET]
TGT_TEXTS = [*_make_corpus(_RNG, TGT_WORDS, 300), " ".join(TGT_WORDS)]
VOCAB_SIZE = 400


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    """One source-side tokenizer of every kind, trained on SRC_TEXTS."""
    cache = tmp_path_factory.mktemp("tok_cache")
    out: dict[str, Tokenizer] = {}
    for kind in KINDS:
        src, _ = build_tokenizers(
            kind,
            SRC_TEXTS,
            TGT_TEXTS,
            vocab_size=VOCAB_SIZE,
            joint=False,
            cache_dir=cache,
        )
        out[kind] = src
    return out


def _id_to_token(tokenizer: Tokenizer, token_id: int) -> str:
    assert isinstance(tokenizer, (SentencePieceTokenizer, VocabTokenizer))
    return tokenizer.id_to_token(token_id)


def _is_plain(value: object) -> bool:
    """True when ``value`` is built only from types torch.load(weights_only=True) accepts."""
    if isinstance(value, (str, int, float, bool, bytes)):
        return True
    if isinstance(value, list):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


@pytest.mark.parametrize("kind", KINDS)
def test_special_tokens_have_fixed_ids(trained: dict[str, Tokenizer], kind: str) -> None:
    tokenizer = trained[kind]
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert tokenizer.kind == kind
    assert isinstance(tokenizer, Tokenizer)
    assert [_id_to_token(tokenizer, i) for i in range(4)] == list(SPECIAL_TOKENS)
    encoded = [i for ids in tokenizer.encode_batch(SRC_TEXTS) for i in ids]
    assert not {PAD_ID, BOS_ID, EOS_ID, UNK_ID} & set(encoded)
    assert max(encoded) < tokenizer.vocab_size


def test_sentencepiece_model_itself_has_the_special_ids(
    trained: dict[str, Tokenizer],
) -> None:
    for kind in ("bpe", "unigram"):
        model = trained[kind].state()["model"]
        assert isinstance(model, bytes)
        sp = spm.SentencePieceProcessor(model_proto=model)
        assert (sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id()) == (0, 1, 2, 3)


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_on_training_text(trained: dict[str, Tokenizer], kind: str) -> None:
    tokenizer = trained[kind]
    for text in SRC_TEXTS[:200]:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_word_round_trip_collapses_whitespace(trained: dict[str, Tokenizer]) -> None:
    words = SRC_WORDS[60:64]
    text = f"  {words[0]}\t{words[1]}\n\n{words[2]}   {words[3]} "
    ids = trained["word"].encode(text)
    assert len(ids) == 4
    assert trained["word"].decode(ids) == " ".join(words)


def test_subwords_are_shorter_than_chars(trained: dict[str, Tokenizer]) -> None:
    text = SRC_TEXTS[0]
    assert len(trained["bpe"].encode(text)) < len(trained["char"].encode(text)) == len(text)
    assert len(trained["word"].encode(text)) == len(text.split())


@pytest.mark.parametrize("kind", KINDS)
def test_empty_text_encodes_to_empty(trained: dict[str, Tokenizer], kind: str) -> None:
    assert trained[kind].encode("") == []
    assert trained[kind].encode_batch(["", SRC_TEXTS[0]])[0] == []
    assert trained[kind].decode([]) == ""


@pytest.mark.parametrize("kind", KINDS)
def test_unseen_symbols_map_to_unk(trained: dict[str, Tokenizer], kind: str) -> None:
    tokenizer = trained[kind]
    ids = tokenizer.encode("a жжж b")
    assert UNK_ID in ids
    assert UNK_PIECE in tokenizer.decode(ids)


def test_unk_rendering_for_vocab_kinds(trained: dict[str, Tokenizer]) -> None:
    char = trained["char"]
    assert char.encode("aжb") == [char.encode("a")[0], UNK_ID, char.encode("b")[0]]
    assert char.decode(char.encode("aжb")) == f"a{UNK_PIECE}b"
    word = trained["word"]
    assert word.encode("a nevernever b <s>") == [
        *word.encode("a"),
        UNK_ID,
        *word.encode("b"),
        UNK_ID,
    ]
    assert word.decode(word.encode("a nevernever b")) == f"a {UNK_PIECE} b"
    assert word.decode([word.vocab_size + 5]) == UNK_PIECE  # out-of-range id


@pytest.mark.parametrize("kind", KINDS)
def test_decode_skips_pad_bos_and_stops_at_eos(trained: dict[str, Tokenizer], kind: str) -> None:
    tokenizer = trained[kind]
    ids = tokenizer.encode(SRC_TEXTS[0])
    other = tokenizer.encode(SRC_TEXTS[1])
    noisy = [BOS_ID, *ids[:2], PAD_ID, *ids[2:], EOS_ID, *other, EOS_ID, PAD_ID, PAD_ID]
    assert tokenizer.decode(noisy) == SRC_TEXTS[0] == tokenizer.decode(ids)
    assert tokenizer.decode([EOS_ID, *ids]) == ""
    assert tokenizer.decode(torch.tensor([BOS_ID, *ids, EOS_ID])) == SRC_TEXTS[0]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_decode_ignores_specials_property(
    trained: dict[str, Tokenizer], kind: str, data: st.DataObject
) -> None:
    tokenizer = trained[kind]
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), max_size=30))
    cut = ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids
    content = [i for i in cut if i not in (PAD_ID, BOS_ID)]
    assert tokenizer.decode(ids) == tokenizer.decode(content)


@pytest.mark.parametrize("kind", KINDS)
def test_encode_batch_matches_encode(trained: dict[str, Tokenizer], kind: str) -> None:
    tokenizer = trained[kind]
    texts = [*SRC_TEXTS[:50], "", "ж"]
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(t) for t in texts]


@pytest.mark.parametrize("kind", KINDS)
def test_joint_is_one_tokenizer_covering_both_sides(tmp_path: Path, kind: str) -> None:
    src, tgt = build_tokenizers(
        kind, SRC_TEXTS, TGT_TEXTS, vocab_size=2000, joint=True, cache_dir=tmp_path
    )
    assert src is tgt
    for text in (SRC_TEXTS[0], TGT_TEXTS[0]):
        ids = src.encode(text)
        assert UNK_ID not in ids
        assert src.decode(ids) == text


@pytest.mark.parametrize("kind", KINDS)
def test_separate_tokenizers_have_different_vocabularies(
    trained: dict[str, Tokenizer], tmp_path: Path, kind: str
) -> None:
    src, tgt = build_tokenizers(
        kind,
        SRC_TEXTS,
        TGT_TEXTS,
        vocab_size=VOCAB_SIZE,
        joint=False,
        cache_dir=tmp_path,
    )
    assert src is not tgt
    assert src.state() != tgt.state()
    assert src.state() == trained[kind].state()
    assert UNK_ID in src.encode(TGT_TEXTS[0])  # the source side never saw the target alphabet
    assert UNK_ID not in tgt.encode(TGT_TEXTS[0])


@pytest.mark.parametrize("kind", KINDS)
def test_state_survives_weights_only_torch_load(trained: dict[str, Tokenizer], kind: str) -> None:
    tokenizer = trained[kind]
    state = tokenizer.state()
    assert _is_plain(state)
    buffer = io.BytesIO()
    torch.save({"tokenizer": state}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["tokenizer"]
    restored = tokenizer_from_state(loaded)
    assert restored.kind == kind
    assert restored.vocab_size == tokenizer.vocab_size
    assert restored.state() == state
    texts = [*SRC_TEXTS[:50], "a жжж b"]
    assert restored.encode_batch(texts) == tokenizer.encode_batch(texts)


@pytest.mark.parametrize("kind", KINDS)
def test_tokenizers_pickle(trained: dict[str, Tokenizer], kind: str) -> None:
    restored = pickle.loads(pickle.dumps(trained[kind]))
    assert restored.encode(SRC_TEXTS[3]) == trained[kind].encode(SRC_TEXTS[3])


def test_invalid_states_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenizer_from_state({"kind": "morfessor", "tokens": []})
    with pytest.raises(ValueError, match="tokens"):
        tokenizer_from_state({"kind": "word", "tokens": "abc"})
    with pytest.raises(ValueError, match="start with"):
        tokenizer_from_state({"kind": "char", "tokens": ["a", "<s>", "</s>", "<unk>"]})
    with pytest.raises(ValueError, match="model"):
        tokenizer_from_state({"kind": "bpe", "model": "not bytes"})


def _counting(monkeypatch: pytest.MonkeyPatch, kind: str) -> list[int]:
    """Wraps the real trainer; returns a list that grows by one per training run of ``kind``."""
    calls: list[int] = []
    real: Callable[..., Tokenizer] = tok._train

    def wrapper(trained: str, *args: object) -> Tokenizer:
        calls.extend([1] if trained == kind else [])
        return real(trained, *args)

    monkeypatch.setattr(tok, "_train", wrapper)
    return calls


@pytest.mark.parametrize("kind", KINDS)
def test_second_build_loads_from_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    calls = _counting(monkeypatch, kind)
    kwargs = {"vocab_size": 300, "joint": False, "cache_dir": tmp_path}
    first = build_tokenizers(kind, SRC_TEXTS, TGT_TEXTS, **kwargs)
    assert len(calls) == 2
    cached = sorted(p.name for p in tmp_path.iterdir())
    assert len(cached) == 2
    assert all(name.startswith(f"{kind}-") for name in cached)
    second = build_tokenizers(kind, SRC_TEXTS, TGT_TEXTS, **kwargs)
    assert len(calls) == 2  # nothing retrained
    assert sorted(p.name for p in tmp_path.iterdir()) == cached
    assert [t.state() for t in second] == [t.state() for t in first]
    assert second[0] is not first[0]


@pytest.mark.parametrize("kind", KINDS)
def test_cache_key_depends_on_settings_and_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    calls = _counting(monkeypatch, kind)
    build_tokenizers(kind, SRC_TEXTS, [], vocab_size=300, joint=True, cache_dir=tmp_path)
    build_tokenizers(kind, SRC_TEXTS, [], vocab_size=301, joint=True, cache_dir=tmp_path)
    build_tokenizers(kind, SRC_TEXTS[:-3], [], vocab_size=300, joint=True, cache_dir=tmp_path)
    build_tokenizers(kind, SRC_TEXTS, [], vocab_size=300, joint=True, cache_dir=tmp_path)
    assert len(calls) == 3
    assert len(list(tmp_path.iterdir())) == 3


def test_cache_key_tracks_the_settings_each_kind_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    word_calls = _counting(monkeypatch, "word")
    bpe_calls = _counting(monkeypatch, "bpe")
    for kind in ("word", "bpe"):
        for min_freq, coverage in ((1, 1.0), (2, 1.0), (1, 0.9995)):
            build_tokenizers(
                kind,
                SRC_TEXTS,
                [],
                vocab_size=300,
                joint=True,
                cache_dir=tmp_path,
                min_freq=min_freq,
                character_coverage=coverage,
            )
    assert len(word_calls) == 2  # min_freq matters for words, coverage does not
    assert len(bpe_calls) == 2  # coverage matters for sentencepiece, min_freq does not


@pytest.mark.parametrize("kind", KINDS)
def test_training_is_deterministic(tmp_path: Path, kind: str) -> None:
    a, _ = build_tokenizers(
        kind, SRC_TEXTS, [], vocab_size=300, joint=True, cache_dir=tmp_path / "a"
    )
    b, _ = build_tokenizers(
        kind, SRC_TEXTS, [], vocab_size=300, joint=True, cache_dir=tmp_path / "b"
    )
    assert a is not b
    assert a.state() == b.state()


def test_word_vocab_frequency_order_cap_and_min_freq() -> None:
    texts = ["b a c c", "a c d", "e b <s>"]
    vocab = build_vocab("word", texts, vocab_size=7, min_freq=1)
    assert vocab.state()["tokens"] == [
        *SPECIAL_TOKENS,
        "c",
        "a",
        "b",
    ]  # ties sorted by string
    vocab = build_vocab("word", texts, vocab_size=100, min_freq=2)
    assert vocab.state()["tokens"] == [*SPECIAL_TOKENS, "c", "a", "b"]
    vocab = build_vocab("word", texts, vocab_size=100, min_freq=1)
    assert vocab.state()["tokens"] == [*SPECIAL_TOKENS, "c", "a", "b", "d", "e"]
    assert vocab.encode("<s> d") == [UNK_ID, 7]


def test_char_vocab_includes_space() -> None:
    vocab = build_vocab("char", ["ab a", "b"], vocab_size=100)
    assert vocab.state()["tokens"] == [*SPECIAL_TOKENS, "a", "b", " "]
    assert vocab.decode(vocab.encode("ab ba")) == "ab ba"


def test_sentencepiece_vocab_may_be_smaller_than_requested(
    trained: dict[str, Tokenizer],
) -> None:
    assert 4 < trained["unigram"].vocab_size <= VOCAB_SIZE
    assert 4 < trained["bpe"].vocab_size <= VOCAB_SIZE


def test_unknown_kind_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown tokenizer kind 'wordpiece'.*bpe.*unigram.*word"):
        build_tokenizers("wordpiece", ["a"], ["b"], vocab_size=100, joint=True, cache_dir=tmp_path)


@pytest.mark.parametrize(
    ("vocab_size", "min_freq", "coverage", "message"),
    [
        (4, 1, 1.0, "vocab_size must exceed"),
        (100, 0, 1.0, "min_freq must be >= 1"),
        (100, 1, 0.0, "character_coverage must be in"),
    ],
)
def test_bad_settings_are_rejected(
    tmp_path: Path, vocab_size: int, min_freq: int, coverage: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_tokenizers(
            "word",
            ["a"],
            ["b"],
            vocab_size=vocab_size,
            joint=True,
            cache_dir=tmp_path,
            min_freq=min_freq,
            character_coverage=coverage,
        )


def test_sentencepiece_too_small_vocab_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="SentencePiece bpe training failed"):
        build_tokenizers("bpe", SRC_TEXTS, [], vocab_size=10, joint=True, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half-written into the cache


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=CHAR_ALPHABET, max_size=60))
def test_char_round_trip_property(trained: dict[str, Tokenizer], text: str) -> None:
    ids = trained["char"].encode(text)
    assert len(ids) == len(text)
    assert UNK_ID not in ids
    assert trained["char"].decode(ids) == text


_WHITESPACE = st.sampled_from([" ", "  ", "\t", "\n", " \n "])


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.sampled_from(SRC_WORDS), max_size=15),
    seps=st.lists(_WHITESPACE, min_size=16, max_size=16),
)
def test_word_round_trip_property(
    trained: dict[str, Tokenizer], words: list[str], seps: list[str]
) -> None:
    text = seps[0] + "".join(w + s for w, s in zip(words, seps[1:], strict=False))
    ids = trained["word"].encode(text)
    assert len(ids) == len(words)
    assert UNK_ID not in ids
    assert trained["word"].decode(ids) == " ".join(text.split())


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=string.ascii_letters + " ", max_size=80))
def test_bpe_round_trip_property(trained: dict[str, Tokenizer], text: str) -> None:
    # SentencePiece's default normalisation drops leading/trailing and repeated spaces.
    ids = trained["bpe"].encode(text)
    assert UNK_ID not in ids
    assert trained["bpe"].decode(ids) == " ".join(text.split())


# --------------------------------------------------------------------------- lowercase

CASED = ["A Man rides A HORSE .", "Eine Frau ÖFFNET die Tür", "ein mann spielt Straße"] * 40


@pytest.mark.parametrize("kind", KINDS)
def test_lowercase_folds_case_in_training_encoding_and_state(tmp_path: Path, kind: str) -> None:
    folding, _ = build_tokenizers(
        kind, CASED, CASED, vocab_size=60, joint=True, cache_dir=tmp_path, lowercase=True
    )
    cased, _ = build_tokenizers(kind, CASED, CASED, vocab_size=60, joint=True, cache_dir=tmp_path)
    assert folding.lowercase
    assert not cased.lowercase
    assert len(list(tmp_path.iterdir())) == 2  # cached apart: the setting is in the key
    assert folding.encode("A MAN öffnet") == folding.encode("a man ÖFFNET")
    assert cased.encode("A Man") != cased.encode("a man")
    ids = folding.encode("Eine Frau ÖFFNET die Tür")
    assert UNK_ID not in ids  # no capital letter was left out of the vocabulary
    assert folding.decode(ids).replace(" ", "") == "einefrauöffnetdietür"  # ß and all: lowercase
    pieces = [folding.id_to_token(i) for i in range(len(SPECIAL_TOKENS), folding.vocab_size)]
    assert all(p == p.lower() for p in pieces)  # trained on lowercased text
    restored = tokenizer_from_state(folding.state())
    assert restored.lowercase
    assert restored.encode("A Man") == folding.encode("A Man")
    assert tokenizer_from_state(cased.state()).lowercase is False


@pytest.mark.parametrize("kind", KINDS)
def test_the_default_keeps_earlier_cache_keys_and_states(kind: str) -> None:
    key = tok.Settings(VOCAB_SIZE).key(kind)
    assert "lowercase" not in key
    assert tok.Settings(VOCAB_SIZE, lowercase=True).key(kind) == {**key, "lowercase": True}
    if kind in ("word", "char"):
        assert "lowercase" not in build_vocab(kind, CASED, vocab_size=30).state()
