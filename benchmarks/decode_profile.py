"""Where our decoding time goes: torch.profiler over one run of seq2seq.decode.search, ops
grouped."""

from __future__ import annotations

import time

from decode_engines import FORCED, Inputs, Mode, ours_decoder

GROUPS = {  # profiler op name -> group (the rest: "other ops")
    "mkldnn::_linear_pointwise": "linear layers",
    "aten::addmm": "linear layers",
    "aten::mm": "linear layers",
    "aten::bmm": "attention",
    "aten::_softmax": "attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::index_select": "cache reorder (beams, finished sentences)",
    "aten::_log_softmax": "log_softmax",
    "aten::topk": "topk / max",
    "aten::max": "topk / max",
    "aten::native_layer_norm": "layer norm",
}


def profile_ours(inputs: Inputs, mode: Mode) -> dict:
    """Self time of the profiled ops by group, plus the time outside them (Python, dispatch)."""
    from torch.profiler import ProfilerActivity, profile

    decode = ours_decoder(inputs, mode)
    decode(inputs.src_ids)  # warm-up: caches, allocator, thread pool
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        decode(inputs.src_ids)
        wall = time.perf_counter() - start  # before the profiler's own wrap-up
    groups: dict[str, float] = {}
    for event in prof.key_averages():
        name = GROUPS.get(event.key, "other ops")
        groups[name] = groups.get(name, 0.0) + event.self_cpu_time_total / 1e6
    groups["outside ops (Python, profiler)"] = max(0.0, wall - sum(groups.values()))
    share = {name: seconds / wall for name, seconds in sorted(groups.items(), key=lambda x: -x[1])}
    return {
        "mode": mode.name,
        "forced_tokens": FORCED if mode.forced else None,
        "profiled_seconds": wall,
        "share": share,
    }
