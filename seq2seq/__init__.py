"""seq2seq: train Transformer translation models end to end, driven by Hydra configs."""

__version__ = "0.1.0"
