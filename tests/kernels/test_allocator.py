"""keep_freed_memory (seq2seq/kernels/allocator.py): with glibc, blocks up to 32 MiB come from
the heap and freed ones stay there for reuse (as glibc's mallinfo2 reports); elsewhere nothing
changes and it returns False. The page faults this saves a training step are measured by
benchmarks/allocator_faults.py, not here."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

import seq2seq.kernels.allocator as allocator
from seq2seq.kernels.allocator import keep_freed_memory
from tests.tiny_run import checkout_pythonpath

BLOCK = 4 * 2**20  # over glibc's initial mmap threshold (128 KiB), under the raised one

# In its own process (the setting is process-wide): with glibc's initial thresholds fixed, then
# after keep_freed_memory(), malloc and free one BLOCK at a time and print, as JSON, the bytes
# mmapped and the heap growth while it is held, and the heap growth left after it is freed.
PROBE = """
import ctypes, importlib.util, json, sys
# the module file alone: the kernels package would load torch, whose allocations would blur these
spec = importlib.util.spec_from_file_location("allocator", sys.argv[2])
allocator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(allocator)
keep_freed_memory = allocator.keep_freed_memory
BLOCK = int(sys.argv[1])
try:
    libc = ctypes.CDLL("libc.so.6")
    mallinfo2 = libc.mallinfo2  # glibc 2.33+
except (OSError, AttributeError):
    print("null")
    sys.exit()
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
mallinfo2.restype, libc.malloc.restype = Info, ctypes.c_void_p
libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]
libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
def block():
    before = mallinfo2()
    pointer = libc.malloc(BLOCK)
    held = mallinfo2()
    libc.free(pointer)
    after = mallinfo2()
    return {"mmapped": held.hblkhd - before.hblkhd, "heap": held.arena - before.arena,
            "kept": after.arena - before.arena}
libc.mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD: the initial one, and no dynamic raising
libc.mallopt(-1, 128 << 10)  # M_TRIM_THRESHOLD: the initial one
initial = block()
tuned = keep_freed_memory()
print(json.dumps({"initial": initial, "tuned": tuned, "first": block(), "again": block()}))
"""


def malloc_probe() -> dict[str, Any] | None:
    """PROBE's measurements, or None without glibc 2.33+."""
    env = {**os.environ, "PYTHONPATH": checkout_pythonpath()}
    args = [sys.executable, "-c", PROBE, str(BLOCK), str(allocator.__file__)]
    done = subprocess.run(args, check=True, env=env, capture_output=True, text=True)
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_freed_blocks_stay_in_the_heap_for_reuse() -> None:
    found = malloc_probe()
    if found is None:
        pytest.skip("not glibc 2.33+ (no mallinfo2)")
    initial, first, again = found["initial"], found["first"], found["again"]
    assert initial["mmapped"] >= BLOCK, found  # the control: glibc mmaps such a block
    assert found["tuned"] is True
    assert first["mmapped"] == 0, found
    assert first["heap"] >= BLOCK, found  # from the heap now
    assert first["kept"] >= BLOCK, found  # and not trimmed off it when freed
    assert again["mmapped"] == 0, found
    assert again["heap"] < BLOCK, found  # the freed block reused


def test_elsewhere_than_linux_nothing_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str] = []
    monkeypatch.setattr(allocator, "sys", SimpleNamespace(platform="darwin"))
    monkeypatch.setattr(ctypes, "CDLL", lambda name: loaded.append(name))
    assert keep_freed_memory() is False
    assert loaded == []


def test_without_glibc_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    def musl(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(allocator, "sys", SimpleNamespace(platform="linux"))
    monkeypatch.setattr(ctypes, "CDLL", musl)
    assert keep_freed_memory() is False


def test_a_refused_setting_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    def mallopt(param: int, value: int) -> int:
        calls.append((param, value))
        return 0  # glibc's answer to a value it does not accept

    monkeypatch.setattr(allocator, "sys", SimpleNamespace(platform="linux"))
    monkeypatch.setattr(ctypes, "CDLL", lambda name: SimpleNamespace(mallopt=mallopt))
    assert keep_freed_memory() is False
    assert calls[0] == (allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD)
