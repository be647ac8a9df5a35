"""tests/search_golden.py's comparison: a recording made on another CPU may differ from this
machine's search only where a near-tie lets float rounding flip a choice; anywhere else a token
that differs fails, and so does a recorded score that the model no longer gives."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch

from seq2seq.config.schema import PosKind
from seq2seq.model.transformer import EncoderDecoder
from tests import search_golden

TWIN, OF = 5, 9  # TWIN gets the output row of OF, a token the recorded outputs are full of


def twin_model(lead: float) -> EncoderDecoder:
    """The recorded sinusoidal model with token TWIN made OF's twin: the same output row, and a
    bias `lead` above OF's (a near-tie wherever OF is a candidate: the order of the two flips
    with the sign of `lead`, as float rounding may flip it between two CPUs)."""
    model = search_golden.model_of(PosKind.sinusoidal)
    with torch.no_grad():
        model.out.weight[TWIN] = model.out.weight[OF]
        model.out.bias[TWIN] = model.out.bias[OF] + lead
    return model


def tokens(hyps: list[list[Any]]) -> list[list[int]]:
    return [h[0] for h in hyps]


@pytest.mark.parametrize("case", ["greedy", "beam-gnmt"])
def test_a_near_tie_flipped_on_another_cpu_is_accepted(case: str) -> None:
    """The 'recording' chose TWIN where this machine chooses OF: the tokens differ from there
    on, and the comparison accepts exactly those sentences; a wrong recorded score in one of
    them is still refused."""
    here, there = twin_model(-1e-6), twin_model(1e-6)
    got, recorded = search_golden.search(here, case), search_golden.search(there, case)
    differ = [i for i, (a, b) in enumerate(zip(got, recorded)) if tokens(a) != tokens(b)]
    assert differ  # a plain comparison would fail
    srcs = search_golden.sources()
    assert search_golden.compare(here, srcs, case, got, recorded) == differ
    wrong = copy.deepcopy(recorded)
    wrong[differ[0]][0][1] += 0.01
    with pytest.raises(AssertionError):
        search_golden.compare(here, srcs, case, got, wrong)


@pytest.mark.parametrize("case", sorted(search_golden.CASES))
def test_a_changed_token_without_a_near_tie_is_refused(case: str) -> None:
    """One token of the recording changed, in the sentence whose search has the widest margin
    between its candidates: a regression, not rounding."""
    key = f"sinusoidal/{case}"
    recorded = json.loads(search_golden.GOLDEN.read_text(encoding="utf-8"))[key]
    model, srcs = search_golden.model_of(PosKind.sinusoidal), search_golden.sources()
    cfg, min_len = search_golden.CASES[case], search_golden.min_len_of(case)
    margins = [search_golden.decision_margin(model, ids, cfg, min_len) for ids in srcs]
    i = max(range(len(srcs)), key=lambda j: margins[j])
    assert margins[i] > 10 * search_golden.TIE
    changed = copy.deepcopy(recorded)
    last = changed[i][0][0]
    last[-1] = 4 if last[-1] != 4 else 5
    with pytest.raises(AssertionError, match="no two candidates of its search are within"):
        search_golden.compare(model, srcs, case, search_golden.search(model, case), changed)
