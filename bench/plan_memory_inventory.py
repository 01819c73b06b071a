"""Every tensor autograd keeps for the backward of megatron-core's local-spec DeepSeek-V3 layers on CPU,
deduplicated by storage and attributed to the innermost module running when it was saved: the inventory
memory.py's cpu_local_layer_bytes is written from (docs/plan-validation.md).

    .venv-current-cpu/bin/python bench/plan_memory_inventory.py --hidden 256 --seq 32 [--recompute]

Small widths take seconds; the full width (--hidden 7168) takes several GiB: run it under the heavy lock.
The same model as bench/plan_memory_cpu.py (its build, narrow and logprob_loss).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import plan_memory_cpu as B  # noqa: E402

from tests.tools.weights import megatron_cpu as MC  # noqa: E402


def inventory(hf: dict, seq: int, recompute: bool) -> list[tuple[int, str, tuple, str]]:
    """(bytes of the storage, module, shape, dtype) of every saved tensor that is not a parameter."""
    model = B.build(hf, recompute)
    stack = ["<top>"]

    def pre(name):
        return lambda m, a: stack.append(name)

    def post(m, a, o):
        stack.pop()

    for name, m in model.named_modules():
        m.register_forward_pre_hook(pre(name or "<model>"))
        m.register_forward_hook(post)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[int, str, tuple, str]] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.data_ptr() not in seen:
            seen[st.data_ptr()] = (st.nbytes(), stack[-1], tuple(t.shape), str(t.dtype))
        return t

    ids = torch.randint(0, hf["vocab_size"], (1, seq), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        B.logprob_loss(model, ids)
    return sorted(seen.values(), key=lambda x: x[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--recompute", action="store_true", help="full recompute (block, every layer)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    MC.apply_shims()
    MC.init_dist(0, 1, B.free_port(), 1, 1, 1)
    hf = B.FULL if args.hidden == B.FULL["hidden_size"] else B.narrow(args.hidden)
    rows = inventory(hf, args.seq, args.recompute)
    for n, where, shape, dtype in rows:
        print(f"{n:>12}  {where:64} {shape} {dtype}")
    print(f"{sum(r[0] for r in rows):>12}  total")
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
