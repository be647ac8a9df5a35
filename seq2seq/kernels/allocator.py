"""Keeping freed memory in the process (glibc's malloc on Linux).

A CPU training step allocates and frees the same large buffers (activations, logits chunks,
gradients) again and again. By default glibc serves blocks over a sliding threshold (from
128 KiB) with mmap and trims the top of the heap above 128 KiB of free space, so every such
block comes back from the kernel as fresh pages and is faulted in and zeroed once more, most
of all in the fused output layer and loss (seq2seq/kernels/loss.py). Raising both thresholds
keeps those blocks in the heap for reuse; the cost is that memory freed after the peak is not
handed back to the system while the process lives. seq2seq.kernels.setup_process calls it for
CPU training and decoding: a beam search's logits and log-probabilities, (batch x beam, vocab)
each, are such blocks at every step (beam 5 on Multi30k: 1.19x faster with it, greedy 1.1x, on
the Intel Xeon without AMX of docs/BENCHMARKS.md).
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc's malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # the largest glibc accepts: bigger blocks are still mmapped
TRIM_THRESHOLD = 2**31 - 1  # never trim the top of the heap (an int in C)


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (see the module docstring); True if it did. On
    other platforms or C libraries (macOS, Windows, musl) nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
