"""Recipes (recipes/*.yaml) compose, and every verl key they pass is a real key of verl 0.6.0's config."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from tests.conftest import STACK, upstream_tree
from tools import stacks
from tools.errors import exit_status
from tools.launch.__main__ import main as cli_main
from tools.recipes import recipe as R
from tools.recipes.mcore_fields import classify, transformer_config_fields

pytestmark = pytest.mark.every_stack  # each stack's recipes against its own verl

RECIPE_NAMES = [name for name, _ in R.list_recipes() if R.runs_on(name, STACK)]  # this session's stack


def test_the_three_primary_recipes_exist_with_descriptions():
    rows = dict(R.list_recipes())
    assert {"deepseek-v3-671b-a3", "qwen2.5-7b-a2", "tiny-cpu"} <= set(rows)
    assert all(desc for desc in rows.values())
    assert R.list_group("model") == [
        "deepseek-v3-671b",
        "qwen2.5-7b",
        "tiny-deepseek-v3",
        "tiny-deepseek-v3-parallel",
    ]
    assert R.list_group("hardware") == ["a2-8", "a3-16x16", "cpu"]
    assert R.list_group("algorithm") == ["grpo-r1-zero"]
    assert R.list_group("stack") == sorted(stacks.load())


def test_a_recipe_composes_for_each_stack_and_refuses_one_it_does_not_run_on():
    for name in stacks.load():
        assert R.compose("qwen2.5-7b-a2", stack=name).launch.stack == name
    every = set(stacks.load())
    only = [(n, R.recipe_stacks(n)) for n, _ in R.list_recipes() if set(R.recipe_stacks(n) or every) != every]
    assert only, "no recipe runs on one stack only: nothing checks the refusal"
    for name, listed in only:
        other = next(s for s in stacks.load() if s not in listed)
        with pytest.raises(R.RecipeError) as e:
            R.compose(name, stack=other)
        assert f"does not run on stack {other}" in str(e.value) and f"STACK={listed[0]}" in e.value.fix


@pytest.mark.parametrize(
    "path", sorted(R.RECIPES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(R.RECIPES))
)
def test_every_file_has_only_launch_and_verl(path: Path):
    raw = OmegaConf.load(path)
    assert set(raw.keys()) - {"defaults"} <= {"launch", "verl"}, f"{path}: top-level keys {list(raw.keys())}"
    if path.parent != R.RECIPES:
        assert path.read_text().startswith("# @package _global_"), f"{path}: group files are _global_"


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_verl_accepts_every_key_of_every_recipe(name: str):
    cfg = R.compose(name)
    verl_cfg = R.compose_verl(cfg)  # raises RecipeError on any key verl does not have
    # and what verl composed is what the recipe asked for, key by key
    for key, value, _added in R.verl_items(cfg):
        got = OmegaConf.select(verl_cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == value, f"{name}: verl.{key} = {got!r}, recipe says {value!r}"


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_every_recipe_whose_engine_returns_log_probs_logs_the_mismatch(name: str):
    """verl logs training/rollout_probs_diff_* (the report's mismatch line, the hand-over check) only with
    rollout.calculate_log_probs; vLLM and vllm-ascend return the sampled token's log-prob for one float a
    token, so every recipe on an engine that can turns it on (verl 0.6.0's HF rollout cannot)."""
    rollout = R.compose(name).verl.actor_rollout_ref.rollout
    if rollout.get("name") != "vllm" or STACK != "current":
        pytest.skip(f"{name} on {STACK}: rollout {rollout.get('name')} returns no log-probs to verl")
    assert rollout.get("calculate_log_probs") is True, f"{name}: rollout.calculate_log_probs is not on"


# keys verl's code reads that its config files do not declare: (file in verl, the read it does)
READ_BY_VERL = {
    "data.seed": ("verl/trainer/main_ppo.py", 'data_config.get("seed", 1)'),
    # (published: tiny-zero's validation responses; its trainer reads the key, its Megatron yaml leaves it out)
    "trainer.validation_data_dir": (
        "verl/trainer/ppo/ray_trainer.py",
        'trainer.get("validation_data_dir", None)',
    ),
    # current stack (verl 0.9.1): keys its yaml leaves out that its code reads
    # the async modes: kwargs verl hands a custom sampler (the tallied sampler's poll interval); its yaml has
    # an empty dict there, so a key into it is added
    "trainer.v1.sampler.sampler_kwargs": (
        "verl/trainer/ppo/v1/trainer_base.py",
        "sampler_kwargs=sampler_config.sampler_kwargs",
    ),
    "ray_kwargs.ray_init.runtime_env": ("verl/trainer/main_ppo.py", 'ray_init_kwargs.get("runtime_env", {})'),
    "actor_rollout_ref.model.override_config": ("verl/workers/config/model.py", "override_config: dict"),
    "actor_rollout_ref.rollout.enable_sleep_mode": (
        "verl/workers/rollout/vllm_rollout/vllm_async_server.py",
        "self.config.enable_sleep_mode",
    ),
    "actor_rollout_ref.rollout.engine_kwargs.vllm": (
        "verl/workers/rollout/vllm_rollout/vllm_async_server.py",
        'self.config.get("engine_kwargs", {})',
    ),
}
TRANSFORMER_OVERRIDES = (
    "actor_rollout_ref.actor.megatron.override_transformer_config",
    "actor_rollout_ref.ref.megatron.override_transformer_config",
)


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_added_keys_are_megatron_fields_or_known_mindspeed_arguments(name: str):
    cfg = R.compose(name)
    for prefix in cfg.launch.verl_add:
        if prefix in READ_BY_VERL:
            file, read = READ_BY_VERL[prefix]
            assert read in (upstream_tree("verl") / file).read_text(), (prefix, file)
            continue
        assert prefix in TRANSFORMER_OVERRIDES, prefix
        keys = list(OmegaConf.select(cfg.verl, prefix).keys())
        mla = cfg.launch.model_config.model_type == "deepseek_v3"
        split = classify(keys, mla=mla)
        assert (
            split["unknown"] == []
        ), f"{name}: not Megatron fields nor MindSpeed arguments: {split['unknown']}"


def test_megatron_fields_are_read_from_the_pinned_source():
    fields = transformer_config_fields(True)
    assert {"recompute_granularity", "num_layers_in_first_pipeline_stage", "q_lora_rank"} <= fields
    assert "q_lora_rank" not in transformer_config_fields(False)  # MLA-only field
    assert classify(["recompute_num_layerz"], mla=True)["unknown"] == ["recompute_num_layerz"]


def _recipes_copy(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "recipes"
    shutil.copytree(R.RECIPES, root)
    monkeypatch.setenv("ASCEND_R1_RECIPES", str(root))
    return root


def test_a_misspelt_verl_key_in_a_recipe_file_fails_naming_it(tmp_path, monkeypatch):
    root = _recipes_copy(tmp_path, monkeypatch)
    algo = root / "algorithm" / "grpo-r1-zero.yaml"
    algo.write_text(algo.read_text().replace("kl_loss_coef:", "kl_loss_coeff:"))
    cfg = R.compose("qwen2.5-7b-a2")  # our side has no schema for verl: composes
    with pytest.raises(R.RecipeError, match=r"actor_rollout_ref\.actor\.kl_loss_coeff"):
        R.compose_verl(cfg)


def test_a_key_under_verl_add_is_passed_with_plus_plus_and_others_plain():
    argv = R.verl_argv(R.compose("deepseek-v3-671b-a3"))
    assert argv[:4] == ["-m", "verl.trainer.main_ppo", "--config-name", "ppo_megatron_trainer"]
    assert "++actor_rollout_ref.actor.megatron.override_transformer_config.seq_length=2048" in argv
    assert "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8" in argv
    assert "actor_rollout_ref.rollout.max_num_seqs=64" in argv
    plus = [a for a in argv if a.startswith("+")]
    assert all(a.startswith("++actor_rollout_ref.actor.megatron.override_transformer_config.") for a in plus)


def test_the_flagship_reproduces_the_published_launch_facts():
    cfg = R.compose("deepseek-v3-671b-a3")
    v, launch = cfg.verl, cfg.launch
    arr = v.actor_rollout_ref
    assert (launch.nodes, launch.devices_per_node, launch.world_size) == (16, 16, 256)
    assert arr.rollout.tensor_model_parallel_size == 2
    if STACK == "published":  # SPMD rollout: the project's DP-group patch reads VLLM_DP_SIZE
        assert R.verl_env(cfg)["VLLM_DP_SIZE"] == "128" and arr.rollout.max_num_batched_tokens == 3072
    else:  # server mode: vLLM's own DP x TP replica over every rank, experts over all of them
        assert "VLLM_DP_SIZE" not in R.verl_env(cfg) and arr.rollout.max_num_batched_tokens == 1024
        assert (arr.rollout.data_parallel_size, arr.rollout.expert_parallel_size) == (128, 256)
    mg = arr.actor.megatron
    assert (
        mg.expert_model_parallel_size,
        mg.tensor_model_parallel_size,
        mg.pipeline_model_parallel_size,
    ) == (32, 1, 8)
    otc = mg.override_transformer_config
    assert (otc.num_layers_in_first_pipeline_stage, otc.num_layers_in_last_pipeline_stage) == (6, 7)
    assert (otc.recompute_granularity, otc.recompute_method, otc.recompute_num_layers) == ("full", "block", 8)
    assert (mg.param_offload, mg.optimizer_offload, otc.swap_optimizer) == (True, False, True)
    # verl 0.9.1's param_offload frees the grads too; verl 0.6.0 has a switch of its own
    assert mg.get("grad_offload", cfg.launch.param_offload_includes_grads) is True
    assert (v.data.train_batch_size, arr.rollout.n, arr.actor.ppo_mini_batch_size) == (512, 16, 512)
    assert arr.actor.ppo_micro_batch_size_per_gpu == 1 and arr.actor.optim.lr == 1e-6
    assert (arr.actor.use_kl_loss, arr.actor.kl_loss_coef, arr.actor.kl_loss_type) == (
        True,
        0.001,
        "low_var_kl",
    )
    assert v.algorithm.kl_ctrl.kl_coef == 0
    assert (v.data.max_prompt_length, v.data.max_response_length, arr.rollout.temperature) == (
        1024,
        2048,
        1.0,
    )
    assert (arr.rollout.max_num_seqs, arr.rollout.gpu_memory_utilization) == (64, 0.8)
    assert (
        arr.rollout.log_prob_micro_batch_size_per_gpu == 4 and arr.ref.log_prob_micro_batch_size_per_gpu == 4
    )
    assert otc.yarn_scaling_factor == 40 and otc.seq_length == 2048
    env = R.verl_env(cfg)
    for k, val in {
        "HCCL_CONNECT_TIMEOUT": "600",
        "HCCL_EXEC_TIMEOUT": "600",
        "HCCL_BUFFSIZE": "300",
        "HCCL_OP_EXPANSION_MODE": "AIV",
        "TASK_QUEUE_ENABLE": "2",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        **({"VLLM_USE_V1": "1", "VLLM_ENABLE_GRAPH_MODE": "1"} if STACK == "published" else {}),
    }.items():
        assert env[k] == val, k
    assert "VLLM_ENABLE_MC2" not in env  # does nothing at these pins


def test_overrides_hydra_style_reach_the_verl_command():
    cfg = R.compose("deepseek-v3-671b-a3", ["verl.actor_rollout_ref.rollout.n=8", "launch.nodes=8"])
    argv = R.verl_argv(cfg)
    assert "actor_rollout_ref.rollout.n=8" in argv and "trainer.nnodes=8" in argv
    if STACK == "published":
        assert R.verl_env(cfg)["VLLM_DP_SIZE"] == "64"  # derived: 8 x 16 / 2
    else:
        assert "actor_rollout_ref.rollout.data_parallel_size=64" in argv  # derived: 8 x 16 / 2
    swapped = R.compose("qwen2.5-7b-a2", ["hardware=cpu"])
    assert swapped.launch.device == "cpu" and "trainer.device=cpu" in R.verl_argv(swapped)
    with pytest.raises(R.RecipeError, match="no recipe 'tiny-cpux'.*did you mean 'tiny-cpu'"):
        R.compose("tiny-cpux")
    with pytest.raises(R.RecipeError, match="Could not override"):
        R.compose("qwen2.5-7b-a2", ["verl.data.train_batch_sise=3"])


@pytest.mark.parametrize(
    "value",
    [
        0,
        7,
        -1,
        1e-6,
        0.8,
        True,
        False,
        None,
        "low_var_kl",
        "/data/a b/c.parquet",
        "expandable_segments:True",
        "1.0",
        "true",
        "null",
        "it's",
        [6, 8, 7],
        ["console", "file"],
        [],
        {},
        {"a": 1, "b": [1, "x"]},
    ],
)
def test_hydra_values_parse_back_to_the_same_value(value):
    text = R.hydra_value(value)
    parsed = OverridesParser.create().parse_override(f"k={text}").value()
    if isinstance(value, float):
        assert float(parsed) == value
    else:
        assert parsed == value, (value, text, parsed)


def test_dry_run_prints_resolved_config_and_command(capsys):
    assert cli_main(["dry-run", "deepseek-v3-671b-a3", "verl.trainer.total_epochs=2"]) == 0
    out = capsys.readouterr().out
    assert "expert_model_parallel_size: 32" in out
    assert "python -m verl.trainer.main_ppo --config-name ppo_megatron_trainer" in out
    assert "trainer.total_epochs=2" in out
    assert ("VLLM_DP_SIZE=128" in out) == (STACK == "published")
    assert ("actor_rollout_ref.rollout.data_parallel_size=128" in out) == (STACK == "current")
    assert exit_status(cli_main, ["dry-run", "qwen2.5-7b-a2", "verl.data.train_batch_sise=3"]) == 2


@pytest.mark.slow
def test_verls_own_validation_accepts_every_recipe_and_agrees_with_the_planner():
    """verl's main_ppo runs validate_config and builds its dataclasses before it starts any worker."""
    pytest.importorskip("verl")
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from tools.plan import plan

    for name in RECIPE_NAMES:
        v = R.compose_verl(R.compose(name))
        validate_config(v, use_reference_policy=True, use_critic=False)  # raises on a bad batch layout
        omega_conf_to_dataclass(v.actor_rollout_ref.rollout)
    bad = ["verl.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"]
    with pytest.raises(AssertionError, match="must be divisible"):
        validate_config(
            R.compose_verl(R.compose("deepseek-v3-671b-a3", bad)), use_reference_policy=True, use_critic=False
        )
    assert not plan("deepseek-v3-671b-a3", bad, check_machine=False).ok


def test_make_recipes_describes_each_recipe_as_each_stack_runs_it(capsys):
    """`make recipes` once called tiny-cpu, tiny-cpu-parallel and tiny-learn "HF rollout" on every stack,
    while the current stack runs them with vLLM's CPU engine: each stack's line comes from the recipe
    composed for that stack."""
    from tools.launch.__main__ import main

    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for recipe in ("tiny-cpu", "tiny-cpu-parallel", "tiny-learn"):
        at = lines.index(f"  {recipe}")
        per_stack = {ln.split()[0]: ln for ln in lines[at + 1 : at + 3]}
        assert set(per_stack) == {"published", "current"}, lines[at : at + 3]
        assert "HF rollout" in per_stack["published"] and "vLLM" not in per_stack["published"], recipe
        assert "vLLM's CPU build" in per_stack["current"] and "HF rollout" not in per_stack["current"], recipe
        assert "verl 0.6.0" in per_stack["published"] and "verl 0.9.1" in per_stack["current"]
