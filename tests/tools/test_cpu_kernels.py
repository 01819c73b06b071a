"""tools/cpu_kernels.py: the kernel family of a CPU from its flags, what each `launch.cpu_kernels` mode
runs, and how the recipes pass it to vLLM."""

from __future__ import annotations

import pytest

from tools import cpu_kernels as K
from tools.errors import UserError
from tools.recipes.recipe import compose

AMX_XEON = "processor : 0\nflags : fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8 avx512_fp16\n"
AVX2_ONLY = "processor : 0\nflags : fpu sse avx avx2 fma\n"


@pytest.mark.parametrize(
    "cpuinfo, machine, family",
    [
        (AMX_XEON, "x86_64", "amx"),
        ("flags : avx2 avx512f avx512_bf16\n", "x86_64", "avx512_bf16"),
        ("flags : avx2 avx512f\n", "x86_64", "avx512"),
        (AVX2_ONLY, "x86_64", "avx2"),
        ("Features : fp asimd sve\n", "aarch64", "aarch64"),
    ],
)
def test_the_family_follows_the_flags(cpuinfo: str, machine: str, family: str) -> None:
    assert K.family(K.cpu_flags(cpuinfo), machine) == family


def test_native_is_vllm_s_choice_and_portable_the_same_everywhere() -> None:
    assert K.kernels("native", "amx").mla == "AMX_MLA"
    assert K.kernels("native", "avx512_bf16").linear.startswith("oneDNN")
    portable = {(K.kernels("portable", f).mla, K.kernels("portable", f).linear) for f in K.NATIVE}
    assert portable == {("CPU_MLA", "torch")}
    assert K.engine_settings("native") == ({}, {})
    assert K.engine_settings("portable") == ({"attention_backend": "CPU_MLA"}, {K.LINEAR_KERNEL_ENV: "torch"})
    with pytest.raises(UserError, match="launch.cpu_kernels"):
        K.kernels("fast", "amx")


def test_the_line_names_the_flags_the_family_and_the_kernels() -> None:
    line = K.kernels("native", "amx").line(K.cpu_flags(AMX_XEON), "native")
    assert line.startswith(
        "CPU kernels (native): family amx (flags: avx2 avx512f avx512_bf16 amx_tile amx_bf16)"
    )
    assert "MLA AMX_MLA" in line


@pytest.mark.parametrize(
    "mode, backend, linear", [("portable", "CPU_MLA", "torch"), ("native", None, "auto")]
)
def test_the_current_recipe_passes_the_mode_to_vllm(mode: str, backend: str | None, linear: str) -> None:
    cfg = compose("tiny-cpu", [f"launch.cpu_kernels={mode}"], stack="current")
    assert cfg.verl.actor_rollout_ref.rollout.engine_kwargs.vllm.attention_backend == backend
    assert cfg.launch.env[K.LINEAR_KERNEL_ENV] == linear
