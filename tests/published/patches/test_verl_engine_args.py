"""verl/workers/rollout/npu/engine_args.py on its own (no vLLM import): the token-budget rule and the
bad settings it refuses before an engine starts (docs/design.md §6)."""

from __future__ import annotations

import pytest

from tests.published.patches.trees import import_from_tree

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def ea():
    return import_from_tree("verl", "verl.workers.rollout.npu.engine_args")


def test_token_budget_rule(ea):
    assert ea.resolve_token_budget(8192, 3072) == (8192, None)
    budget, note = ea.resolve_token_budget(1024, 3072)
    assert budget == 3072
    assert "max_num_batched_tokens=1024 < max_model_len=3072: raised to 3072" in note
    assert ea.TOKEN_BUDGET_RULE in note


@pytest.mark.parametrize(("value", "graph"), [("1", True), ("true", True), ("0", False), ("", False)])
def test_graph_mode_setting(ea, value, graph):
    assert ea.graph_mode({"VLLM_ENABLE_GRAPH_MODE": value}) is graph
    assert ea.graph_mode({}) is False


def test_bad_graph_mode_value_is_named(ea):
    with pytest.raises(ea.EngineArgsError, match=r"VLLM_ENABLE_GRAPH_MODE='yes': expected 0 or 1"):
        ea.graph_mode({"VLLM_ENABLE_GRAPH_MODE": "yes"})


def test_recipe_arguments(ea):
    args = ea.ascend_engine_args(
        max_num_batched_tokens=1024, max_model_len=3072, max_num_seqs=64, enforce_eager=False,
        env={"VLLM_ENABLE_GRAPH_MODE": "1"},
    )  # fmt: skip
    assert (args.max_num_batched_tokens, args.enable_chunked_prefill, args.enable_prefix_caching) == (
        3072,
        False,
        False,
    )
    assert args.additional_config["torchair_graph_config"]["graph_batch_sizes"] == [64]
    assert len(args.notes) == 1
