"""vllm patch `vllm-v1-engine-keep-KV-cache-configs-for-safe-re-creation` (docs/design.md §5).

`EngineCore` keeps the per-worker KV-cache configs computed at start-up, and
`reinitialize_kv_caches()` re-creates the cache from exactly those configs without profiling memory
again. The engine is built without `__init__`, with a fake executor (the hardware boundary) and
vLLM's own `get_kv_cache_config` / `unify_kv_cache_configs`.

The checks run in a child process whose import path starts with the vLLM tree under test
(`upstream_tree("vllm")`), so they exercise that tree and never an installed vllm. The child is
this file run as a script; it prints one `RESULT <json>` line: check name -> error or null.
Needs the packages under "import vLLM's v1 engine on CPU" in requirements-cpu.txt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest

CHECKS = (
    "startup_stores_the_configs_handed_to_the_executor",
    "recreation_hands_the_identical_configs",
    "recreation_never_profiles_memory",
)
RESULT_PREFIX = "RESULT "

# The fake model: 2 workers (as with TP2), 2 attention layers each.
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
BLOCK_SIZE = 16
PAGE_BYTES = 2 * BLOCK_SIZE * 2 * 8 * 4  # K and V x block x heads x head size x float32
MIB = 1 << 20
# Free memory at start-up per worker (unify_kv_cache_configs keeps the smaller block count), and
# what profiling would report while training state is resident: fewer blocks.
STARTUP_MEMORY = (64 * MIB, 80 * MIB)
TRAINING_MEMORY = (16 * MIB, 16 * MIB)


# ---------------------------------------------------------------- child: runs inside the tree


class FakeExecutor:
    """Stands in for vLLM's executor (the workers and the device); records every call."""

    def __init__(self, kv_cache_specs: list[dict], available_memory: tuple[int, ...]):
        self.kv_cache_specs = kv_cache_specs
        self.available_memory = list(available_memory)
        self.calls: list[tuple[str, object]] = []

    def get_kv_cache_specs(self) -> list[dict]:
        self.calls.append(("get_kv_cache_specs", None))
        return self.kv_cache_specs

    def determine_available_memory(self) -> list[int]:
        self.calls.append(("determine_available_memory", None))
        return list(self.available_memory)

    def initialize_from_config(self, kv_cache_configs: list) -> None:
        self.calls.append(("initialize_from_config", kv_cache_configs))

    def count(self, name: str) -> int:
        return sum(1 for call, _ in self.calls if call == name)

    def handed_configs(self) -> list[list]:
        return [arg for call, arg in self.calls if call == "initialize_from_config"]


def _scenario(tree: Path) -> dict[str, str | None]:
    import torch
    import vllm
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.engine import core
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    vllm_file = Path(vllm.__file__).resolve()
    assert vllm_file.is_relative_to(tree.resolve()), f"imported vllm from {vllm_file}, not from {tree}"

    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=2, head_size=8, dtype=torch.float32, use_mla=False
    )
    assert spec.page_size_bytes == PAGE_BYTES
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=256),
        cache_config=SimpleNamespace(block_size=BLOCK_SIZE, num_gpu_blocks_override=None),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
    )
    executor = FakeExecutor([dict.fromkeys(LAYERS, spec) for _ in STARTUP_MEMORY], STARTUP_MEMORY)

    # Count derivations through the function the engine module calls (the real one underneath).
    derived = []

    def counting_get_kv_cache_config(*args, **kwargs):
        derived.append(args)
        return kv_cache_utils.get_kv_cache_config(*args, **kwargs)

    core.get_kv_cache_config = counting_get_kv_cache_config

    engine = object.__new__(core.EngineCore)
    engine.model_executor = executor
    num_gpu_blocks, num_cpu_blocks, scheduler_config = engine._initialize_kv_caches(vllm_config)

    results: dict[str, str | None] = {}

    def check(name: str, fn) -> None:
        try:
            fn()
            results[name] = None
        except Exception:
            results[name] = traceback.format_exc(limit=-1).strip()

    def startup() -> None:
        stored = getattr(engine, "kv_cache_configs", None)
        assert stored is not None, "EngineCore keeps no kv_cache_configs after _initialize_kv_caches"
        assert executor.count("determine_available_memory") == 1
        assert len(stored) == len(STARTUP_MEMORY)
        assert executor.handed_configs() == [stored]
        assert all(a is b for a, b in zip(executor.handed_configs()[0], stored, strict=True))
        assert scheduler_config is stored[0], "the scheduler is not sized from the stored configs"
        assert {cfg.num_blocks for cfg in stored} == {num_gpu_blocks}, "configs not unified"
        expected = min(STARTUP_MEMORY) // PAGE_BYTES // len(LAYERS)
        assert num_gpu_blocks == expected, f"{num_gpu_blocks} blocks, expected {expected}"
        assert num_cpu_blocks == 0

    # Training state is now resident: profiling again would find less memory, so fewer blocks than
    # the scheduler was sized for. The scenario is only meaningful if that is so.
    executor.available_memory = list(TRAINING_MEMORY)
    fewer = kv_cache_utils.get_kv_cache_config(vllm_config, executor.kv_cache_specs[0], TRAINING_MEMORY[0])
    assert fewer.num_blocks < num_gpu_blocks
    derived_at_startup = len(derived)

    def recreate_three_times() -> list:
        stored = engine.kv_cache_configs
        blocks = [cfg.num_blocks for cfg in stored]
        before = len(executor.handed_configs())
        for _ in range(3):
            engine.reinitialize_kv_caches()
        handed = executor.handed_configs()[before:]
        assert len(handed) == 3, f"{len(handed)} initialize_from_config calls for 3 re-creations"
        assert engine.kv_cache_configs is stored
        assert [cfg.num_blocks for cfg in stored] == blocks, "stored configs were changed"
        return handed

    def identical() -> None:
        for handed in recreate_three_times():
            assert len(handed) == len(engine.kv_cache_configs)
            for got, kept in zip(handed, engine.kv_cache_configs, strict=True):
                assert got is kept, "re-creation handed a config other than the stored one"
                assert got.num_blocks == num_gpu_blocks

    def never_profiles() -> None:
        recreate_three_times()
        assert executor.count("determine_available_memory") == 1, "re-creation profiled memory again"
        assert len(derived) == derived_at_startup, "re-creation derived KV-cache configs again"

    check(CHECKS[0], startup)
    check(CHECKS[1], identical)
    check(CHECKS[2], never_profiles)
    return results


def main() -> None:
    tree = Path(sys.argv[1])
    print(RESULT_PREFIX + json.dumps(_scenario(tree)), flush=True)


# ---------------------------------------------------------------- pytest: the parent


@pytest.fixture(scope="module")
def child_results() -> dict[str, str | None]:
    # importlib import mode registers tests/conftest.py as `tests.conftest` (the child cannot import it)
    from tests.conftest import upstream_tree

    tree = upstream_tree("vllm")
    if not (tree / "vllm" / "v1" / "engine" / "core.py").is_file():
        pytest.fail(f"{tree} is not a vLLM source tree (no vllm/v1/engine/core.py)")
    env = {**os.environ, "PYTHONPATH": str(tree), "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.run(
        [sys.executable, __file__, str(tree)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        pytest.fail(
            f"the check process failed (exit {proc.returncode}); if an import failed, install the "
            f"requirements-cpu.txt lines for vLLM's v1 engine\n{proc.stderr[-4000:]}"
        )
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


@pytest.mark.slow  # about 12 s on 2 cores, nearly all of it importing vllm in the child
@pytest.mark.upstream
@pytest.mark.parametrize("check", CHECKS)
def test_kv_cache_reinit(child_results: dict[str, str | None], check: str) -> None:
    if child_results[check] is not None:
        pytest.fail(f"{check}:\n{child_results[check]}", pytrace=False)


if __name__ == "__main__":
    main()
