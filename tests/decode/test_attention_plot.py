"""Tests for seq2seq.decode.attention_plot: a heatmap per translation, and a clear error without
matplotlib."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from seq2seq.config.commands import AttentionLayers
from seq2seq.decode.attention_plot import require_matplotlib, save_heatmap
from seq2seq.errors import ConfigError


@pytest.mark.parametrize("layers", list(AttentionLayers), ids=lambda x: x.value)
def test_save_heatmap_writes_a_png_sized_by_its_tokens(
    tmp_path: Path, layers: AttentionLayers
) -> None:
    plt = require_matplotlib()
    weights = torch.rand(3, 4, 6).softmax(-1)  # (L, T, S)
    src, tgt = ["▁a", "b", "c", "d", "e", "</s>"], ["x", "y", "z", "</s>"]
    save_heatmap(weights, src, tgt, tmp_path / "one.png", layers, "line 1: x y z")
    image = plt.imread(tmp_path / "one.png")  # (height, width, channels)
    long = ["t"] * 40
    save_heatmap(torch.rand(3, 4, 40), long, tgt, tmp_path / "long.png", layers, "long")
    assert plt.imread(tmp_path / "long.png").shape[1] > image.shape[1]  # wider for 40 tokens
    if layers == AttentionLayers.all:  # three panels side by side
        save_heatmap(weights, src, tgt, tmp_path / "mean.png", AttentionLayers.mean, "mean")
        assert image.shape[1] > 2 * plt.imread(tmp_path / "mean.png").shape[1]


def test_without_matplotlib_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    with pytest.raises(
        ConfigError, match=r"attention_dir needs matplotlib.*pip install matplotlib"
    ):
        require_matplotlib()
