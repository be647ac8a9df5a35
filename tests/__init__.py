"""The test suite (pytest); tests mirror the package."""

# before torch, in every process that imports a test module (pytest's and its workers, and the
# processes that multiprocessing spawns): MKL's Intel code path on AMD CPUs (seq2seq/mkl.py)
# holds there as in the CLI processes the tests start, whose results some compare bit for bit
import seq2seq  # noqa: F401
