"""verl patch `verl-metrics-clip-ratios-compare-lengths-with-the-configured-limits` (current stack).

verl 0.9.1's `compute_data_metrics` takes `response_length/clip_ratio` (and `prompt_length/clip_ratio`) as
the share of responses as long as the batch's padded width. The V1 trainer pads a batch to its longest
response (`to_padded_tensor`), so the ratio counted the responses as long as the longest one, not those the
rollout cut at `rollout.response_length`: 1.0 in a batch whose responses all had 23 tokens under a limit of
32, 1/128 once one response was longer than the rest. The patch gives the function the limits and has the
trainers pass `rollout.response_length` and `data.max_prompt_length`.
"""

from __future__ import annotations

import ast

import pytest
import torch

from tests.conftest import upstream_tree

pytestmark = pytest.mark.upstream

LIMIT = 32


@pytest.fixture(scope="module")
def metric_utils(from_tree):
    return from_tree("verl", "verl.trainer.ppo.metric_utils")


def batch_padded_to_longest(lengths: list[int], prompt: int = 5):
    """A batch as the V1 trainer hands it to compute_data_metrics: responses padded to the longest."""
    from verl.protocol import DataProto

    n, width = len(lengths), max(lengths)
    mask = torch.zeros(n, width)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    tensors = {
        "token_level_scores": torch.zeros(n, width),
        "token_level_rewards": torch.zeros(n, width),
        "advantages": torch.zeros(n, width),
        "returns": torch.zeros(n, width),
        "prompts": torch.zeros(n, prompt, dtype=torch.long),
        "responses": torch.zeros(n, width, dtype=torch.long),
        "response_mask": mask,
        "attention_mask": torch.cat([torch.ones(n, prompt), mask], dim=1),
        "prompt_length": torch.full((n,), float(prompt)),
        "response_length": torch.tensor(lengths, dtype=torch.float),
    }
    return DataProto.from_dict(tensors=tensors)


def test_no_response_reached_the_limit(metric_utils):
    batch = batch_padded_to_longest([23] * 8)  # what step 1 of tiny-learn saw: every response 23 of 32 tokens
    m = metric_utils.compute_data_metrics(
        batch, use_critic=False, max_response_length=LIMIT, max_prompt_length=64
    )
    assert m["response_length/clip_ratio"] == 0.0
    assert m["prompt_length/clip_ratio"] == 0.0


def test_the_share_that_reached_the_limit(metric_utils):
    batch = batch_padded_to_longest([LIMIT, 20, 26, LIMIT])
    m = metric_utils.compute_data_metrics(
        batch, use_critic=False, max_response_length=LIMIT, max_prompt_length=5
    )
    assert m["response_length/clip_ratio"] == 0.5
    assert m["prompt_length/clip_ratio"] == 1.0  # every prompt had the 5 tokens of the limit


def test_without_limits_the_padded_width_as_before(metric_utils):
    batch = batch_padded_to_longest([20, 26])
    m = metric_utils.compute_data_metrics(batch, use_critic=False)
    assert m["response_length/clip_ratio"] == 0.5  # upstream's behaviour where the width is the limit


@pytest.mark.parametrize(
    "module",
    [
        "verl/trainer/ppo/v1/trainer_base.py",
        "verl/trainer/ppo/ray_trainer.py",
        "verl/experimental/separation/ray_trainer.py",
    ],
)
def test_every_trainer_passes_the_configured_limits(module):
    """Each call of compute_data_metrics in verl's trainers names both limits from the config."""
    tree = ast.parse((upstream_tree("verl") / module).read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "compute_data_metrics"
    ]
    assert calls, f"{module}: no call of compute_data_metrics"
    for call in calls:
        given = {k.arg: ast.unparse(k.value) for k in call.keywords}
        assert (
            given.get("max_response_length") == "self.config.actor_rollout_ref.rollout.response_length"
        ), given
        assert given.get("max_prompt_length") == "self.config.data.max_prompt_length", given
