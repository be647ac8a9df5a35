"""seq2seq: train Transformer translation models end to end, driven by Hydra configs."""

__version__ = "0.1.0"

# before anything imports torch: MKL's Intel code paths on AMD CPUs (seq2seq/mkl.py; off with
# SEQ2SEQ_MKL_INTEL_PATH=0)
from seq2seq.mkl import use_intel_path

use_intel_path()


def __getattr__(name: str) -> object:
    """`from seq2seq import Translator` (the Python API, seq2seq/decode/translator.py), imported on
    first use: importing the package stays free of torch."""
    if name == "Translator":
        from seq2seq.decode.translator import Translator

        return Translator
    raise AttributeError(f"module 'seq2seq' has no attribute {name!r}")
