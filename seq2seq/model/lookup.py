"""Attribute reads that skip nn.Module.__getattr__ while a model decodes.

A module keeps its parameters and submodules in dicts of their own (`_parameters`,
`_modules`), not in its instance `__dict__`, so Python finds `self.q_proj` or `self.weight` only
after its normal lookup has failed and fallen back to `nn.Module.__getattr__`. That fallback
costs ~1.7 us a read on an AVX2-only AMD EPYC (family 23 model 1, Python 3.11; a plain
attribute: 0.08 us), and a decoder step of the Multi30k model makes ~180 such reads: a fifth
of a one-sentence step there (docs/BENCHMARKS.md, "Attribute reads").

`direct_attributes(model)` puts every parameter and submodule of the model in its module's
`__dict__` too, for the time of a `with` block, where the normal lookup finds it at once; the
objects are the same, so every read returns what it would have returned. On leaving, the
entries it added go again. Inside the block nothing may replace a parameter or submodule other
than by assignment (`module.name = value`, which drops the entry itself): a direct write into
`_parameters` or `_modules`, a `del`, or setting one to None would leave the old object
readable. Buffers are left alone: assigning one (a positional table that grows while decoding)
does not drop an entry. The searches change no parameter or submodule. Blocks may nest or
overlap (two threads decoding with one model): an entry removed while another block still runs
only sends that block's reads back to `__getattr__`, which returns the same objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def direct_attributes(model: nn.Module) -> Iterator[None]:
    """Inside the block, every module of `model` holds its parameters and submodules in its
    instance __dict__ as well (see the module docstring); entries already there are kept, so
    nested blocks are fine: the outermost one removes what it added."""
    added: list[tuple[nn.Module, str, object]] = []
    for module in model.modules():
        for table in (module._parameters, module._modules):
            for name, value in table.items():
                if name not in module.__dict__:
                    module.__dict__[name] = value
                    added.append((module, name, value))
    try:
        yield
    finally:
        for module, name, entry in added:
            entries = module.__dict__
            if name in entries and entries[name] is entry:  # not dropped by an assignment
                del entries[name]
