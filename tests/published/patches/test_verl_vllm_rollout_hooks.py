"""The hooks of the NPU patches in verl's `vLLMRollout` (docs/design.md §1, §2, §6), through the
real `vLLMRollout.__init__` with a fake engine class that captures its keyword arguments.

vLLM is not installed: its tree under test and a minimal vLLM 0.9.1 dist-info go on sys.path
(docs/design.md §2b). The NPU gate is the module's `is_npu_available`; hccl (vLLM's group construction
on an NPU) is the only other thing replaced, by a recorder.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from tests.published.patches.trees import import_vllm_rollout

pytestmark = [
    pytest.mark.upstream,
    pytest.mark.slow,  # importing vLLM: about 6-15 s
    pytest.mark.usefixtures("restore_environ"),
]


PROMPT, RESPONSE = 1024, 2048  # the recipe: max_model_len 3072


@pytest.fixture(scope="module")
def spmd(tmp_path_factory):
    return import_vllm_rollout(tmp_path_factory.mktemp("meta"))


class FakeLLM:
    """Stands in for vllm.LLM (the engine and the device): records its keyword arguments."""

    calls: list[dict] = []

    def __init__(self, **kwargs):
        FakeLLM.calls.append(kwargs)


def _config(**kw):
    from verl.workers.config import RolloutConfig

    base = dict(
        name="vllm",
        prompt_length=PROMPT,
        response_length=RESPONSE,
        max_num_batched_tokens=1024,
        max_num_seqs=64,
        enforce_eager=False,
        tensor_model_parallel_size=1,
        gpu_memory_utilization=0.8,
        load_format="dummy",
        free_cache_engine=False,  # the offload hook (its own patch and test) stays out of these
    )
    base.update(kw)
    return RolloutConfig(**base)


MODEL = SimpleNamespace(
    local_path="/models/tiny",
    tokenizer=SimpleNamespace(pad_token_id=0),
    hf_config=SimpleNamespace(max_position_embeddings=4096, n_routed_experts=16),
    trust_remote_code=False,
    lora_rank=0,
)


def _build(spmd, monkeypatch, *, npu: bool, env: dict[str, str] | None = None, **config):
    monkeypatch.setattr(spmd, "LLM", FakeLLM)
    monkeypatch.setattr(spmd, "is_npu_available", npu)
    for key in (
        "VLLM_DP_SIZE",
        "VLLM_ENABLE_GRAPH_MODE",
        "VLLM_DP_RANK",
        "VLLM_DP_MASTER_IP",
        "VLLM_DP_MASTER_PORT",
    ):
        monkeypatch.delenv(key, raising=False)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    FakeLLM.calls.clear()
    rollout = spmd.vLLMRollout(_config(**config), MODEL, device_mesh=None)
    assert len(FakeLLM.calls) == 1
    return rollout, FakeLLM.calls[0]


def upstream_kwargs(**over):
    """verl 0.6.0's LLM(...) arguments for _config() (vllm_rollout_spmd.py, vLLMRollout.__init__)."""
    kw = dict(
        model="/models/tiny",
        enable_sleep_mode=False,
        tensor_parallel_size=1,
        distributed_executor_backend="external_launcher",
        dtype="bfloat16",
        enforce_eager=False,
        gpu_memory_utilization=0.8,
        disable_custom_all_reduce=True,
        skip_tokenizer_init=False,
        max_model_len=PROMPT + RESPONSE,
        max_num_seqs=64,
        load_format="dummy",
        disable_log_stats=True,
        max_num_batched_tokens=1024,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        trust_remote_code=False,
        seed=0,
    )
    kw.update(over)
    return kw


# ---------------------------------------------------------------- gate off: upstream exactly


def test_gate_off_is_upstream(spmd, monkeypatch):
    _, kw = _build(spmd, monkeypatch, npu=False, max_num_batched_tokens=8192)
    assert kw == upstream_kwargs(max_num_batched_tokens=8192)
    # and upstream's refusal of the recipe's budget with chunked prefill on stays as it was
    with pytest.raises(ValueError, match="max_num_batched_tokens is smaller than max_model_len"):
        _build(spmd, monkeypatch, npu=False)


def test_gate_off_ignores_vllm_dp_size(spmd, monkeypatch):
    """CUDA with VLLM_DP_SIZE set: no DP groups by hand, no variables set, no EP switched on."""
    _, kw = _build(spmd, monkeypatch, npu=False, env={"VLLM_DP_SIZE": "1"}, max_num_batched_tokens=8192)
    assert kw == upstream_kwargs(max_num_batched_tokens=8192)
    assert "VLLM_DP_RANK" not in os.environ


# ---------------------------------------------------------------- section 6: vllm-ascend arguments


def test_npu_engine_arguments_resolve_the_token_budget(spmd, monkeypatch, caplog):
    _, kw = _build(spmd, monkeypatch, npu=True, env={"VLLM_ENABLE_GRAPH_MODE": "1"})
    assert kw["max_num_batched_tokens"] == PROMPT + RESPONSE  # raised from 1024: ascend scheduler rule
    assert kw["enable_chunked_prefill"] is False and kw["enable_prefix_caching"] is False
    assert kw["additional_config"] == {
        "torchair_graph_config": {
            "enabled": True,
            "use_cached_graph": False,
            "enable_multistream_mla": False,
            "enable_multistream_moe": False,
            "enable_kv_nz": False,
            "graph_batch_sizes": [64],
        },
        "ascend_scheduler_config": {"enabled": True},
        "refresh": True,
    }
    rest = {k: v for k, v in kw.items() if k != "additional_config"}
    assert rest == upstream_kwargs(
        max_num_batched_tokens=3072, enable_chunked_prefill=False, enable_prefix_caching=False
    )


def test_npu_graph_mode_off_and_user_override(spmd, monkeypatch):
    user = {"additional_config": {"ascend_scheduler_config": {"enabled": False}}}
    _, kw = _build(
        spmd, monkeypatch, npu=True, env={"VLLM_ENABLE_GRAPH_MODE": "0"}, engine_kwargs={"vllm": user}
    )
    assert kw["additional_config"] == user["additional_config"]  # the user's engine_kwargs win
    _, kw = _build(spmd, monkeypatch, npu=True)
    tg = kw["additional_config"]["torchair_graph_config"]
    assert tg["enabled"] is False and "graph_batch_sizes" not in tg  # rc3 refuses sizes without graph mode


def test_npu_graph_mode_with_enforce_eager_fails_early(spmd, monkeypatch):
    with pytest.raises(
        ValueError, match="VLLM_ENABLE_GRAPH_MODE=1 with actor_rollout_ref.rollout.enforce_eager"
    ):
        _build(spmd, monkeypatch, npu=True, env={"VLLM_ENABLE_GRAPH_MODE": "1"}, enforce_eager=True)
    assert FakeLLM.calls == []


# ---------------------------------------------------------------- section 2: DP groups hook


def test_npu_with_vllm_dp_size_sets_up_groups_before_the_engine(spmd, monkeypatch):
    from verl.workers.rollout.npu import dp_groups

    built = []
    monkeypatch.setattr(  # hccl is the hardware boundary: record what would be built
        dp_groups,
        "init_vllm_groups",
        lambda tp, backend, device: built.append((tp, backend, device, len(FakeLLM.calls))),
    )
    env = {"VLLM_DP_SIZE": "1", "VLLM_VERSION": "0.9.1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_PORT": "29500"}
    _, kw = _build(spmd, monkeypatch, npu=True, env=env)
    assert built == [(1, "hccl", "npu", 0)], "groups not built, or built after the engine"
    assert kw["enable_expert_parallel"] is True
    assert os.environ["VLLM_DP_RANK"] == "0" and os.environ["VLLM_DP_MASTER_IP"] == "127.0.0.1"
    assert os.environ["VLLM_DP_MASTER_PORT"] == "29510"
    import vllm.envs

    assert vllm.envs.VLLM_DP_MASTER_PORT == 29510


def test_npu_bad_layout_fails_before_the_engine(spmd, monkeypatch):
    from verl.workers.rollout.npu import dp_groups

    env = {"VLLM_DP_SIZE": "2", "VLLM_VERSION": "0.9.1", "GLOO_SOCKET_IFNAME": "lo"}
    with pytest.raises(
        dp_groups.DPLayoutError, match=r"VLLM_DP_SIZE='2': expected 1 \(world size 1 / rollout TP 1\)"
    ):
        _build(spmd, monkeypatch, npu=True, env=env)
    assert FakeLLM.calls == []
