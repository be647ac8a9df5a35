"""Cross-attention heatmaps as PNG files: source tokens across, target tokens down, one panel
(the decoder layers averaged) or one per layer. Needs matplotlib (`pip install matplotlib`, or
the package's `plot` extra)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from torch import Tensor

from seq2seq.config.commands import AttentionLayers
from seq2seq.errors import ConfigError


def require_matplotlib() -> ModuleType:
    """matplotlib.pyplot on a file-only backend, or a ConfigError saying how to install it."""
    try:
        import matplotlib
    except ImportError as err:
        raise ConfigError(
            "config: attention_dir needs matplotlib to draw its PNG files; install it with "
            "`pip install matplotlib` (or `pip install -e '.[plot]'`), or leave attention_dir unset"
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_heatmap(
    weights: Tensor,
    src_tokens: list[str],
    tgt_tokens: list[str],
    path: Path,
    layers: AttentionLayers,
    title: str,
) -> None:
    """Draw weights (L, T, S) of one translation, its tokens on the axes (EOS included), into
    the PNG `path`: the mean of the L layers, or each layer in its own panel."""
    plt = require_matplotlib()
    panels = [weights.mean(0)] if layers == AttentionLayers.mean else list(weights)
    names = (
        ["layers averaged"]
        if layers == AttentionLayers.mean
        else [f"layer {i}" for i in range(len(panels))]
    )
    cell = 0.32  # inches per token: labels stay legible, long sentences get a larger image
    width = max(4.0, 1.5 + cell * len(src_tokens)) * len(panels)
    height = max(3.0, 1.5 + cell * len(tgt_tokens))
    shape = (width, height)  # panels share the target axis: its labels on the first only
    fig, axes = plt.subplots(1, len(panels), figsize=shape, squeeze=False, sharey=True)
    for ax, panel, name in zip(axes[0], panels, names, strict=True):
        image = ax.imshow(panel.numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=90, fontsize=9)
        ax.set_yticks(range(len(tgt_tokens)), tgt_tokens, fontsize=9)
        ax.set_xlabel("source")
        ax.set_title(name, fontsize=9)
    axes[0][0].set_ylabel("target")
    fig.colorbar(image, ax=axes[0].tolist(), fraction=0.03)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
