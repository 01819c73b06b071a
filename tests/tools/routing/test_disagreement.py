"""tools/routing/disagreement.py: the share of tokens routed differently, and the mismatch split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tools.routing.disagreement import (
    layer_disagreement,
    routing_disagreement,
    split_mismatch,
    step_metrics,
    token_disagrees,
)


def test_order_of_the_top_k_does_not_count():
    engine = np.array([[1, 2], [3, 4], [5, 6]])
    actor = np.array([[2, 1], [4, 3], [6, 5]])
    assert routing_disagreement(engine, actor) == 0.0


def test_one_expert_differing_counts_the_token():
    engine = np.array([[1, 2], [3, 4], [5, 6], [0, 7]])
    actor = np.array([[1, 2], [3, 5], [5, 6], [7, 1]])
    assert routing_disagreement(engine, actor) == 0.5
    assert token_disagrees(engine, actor).tolist() == [False, True, False, True]


def test_a_token_differing_in_any_layer_counts_once_and_layers_are_counted_apart():
    # [tokens=3, layers=2, k=2]
    engine = np.array([[[0, 1], [2, 3]], [[0, 1], [2, 3]], [[0, 1], [2, 3]]])
    actor = engine.copy()
    actor[0, 1] = [2, 4]  # token 0, layer 1
    actor[1, 0] = [0, 5]  # token 1, layer 0
    actor[1, 1] = [4, 5]  # token 1, layer 1 too
    assert routing_disagreement(engine, actor) == pytest.approx(2 / 3)
    assert layer_disagreement(engine, actor) == pytest.approx([1 / 3, 2 / 3])


def test_mask_keeps_only_the_response_tokens_and_leading_shape_is_kept():
    # verl's layout [batch=2, seq=3, layers=1, k=2]
    engine = np.zeros((2, 3, 1, 2), dtype=np.int16) + np.array([0, 1], dtype=np.int16)
    actor = engine.copy()
    actor[0, 0, 0] = [0, 2]  # a prompt token: masked out
    actor[1, 2, 0] = [3, 1]  # a response token
    mask = np.array([[0, 1, 1], [0, 1, 1]], dtype=bool)
    assert token_disagrees(engine, actor).shape == (2, 3)
    assert routing_disagreement(engine, actor, mask) == 0.25
    assert math.isnan(routing_disagreement(engine, actor, np.zeros((2, 3), dtype=bool)))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="differ in shape"):
        routing_disagreement(np.zeros((3, 2), int), np.zeros((4, 2), int))
    with pytest.raises(ValueError, match="integers"):
        routing_disagreement(np.zeros((3, 2)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="mask"):
        routing_disagreement(np.zeros((3, 2), int), np.zeros((3, 2), int), np.ones(4, bool))


def test_split_puts_the_mismatch_of_differently_routed_tokens_on_routing():
    diff = np.array([0.9, 0.01, 0.02, 0.5, 0.001])
    dis = np.array([True, False, False, False, False])
    split = split_mismatch(diff, dis, bound=0.1)
    assert split.tokens == 5 and split.routed_differently == 1
    assert split.above_bound == 2 and split.above_bound_routed_differently == 1
    assert split.mean_diff_routing == pytest.approx(0.9)
    assert split.mean_diff_same_route == pytest.approx((0.01 + 0.02 + 0.5 + 0.001) / 4)
    assert split.routing_share == pytest.approx(0.9 / diff.sum())
    assert split.verdict.startswith("routing: 1 of 2")
    precision = split_mismatch(diff, np.zeros(5, bool), bound=0.1)
    assert precision.verdict.startswith("precision: 0 of 2") and precision.routing_share == 0.0
    assert split_mismatch(np.zeros(3), np.zeros(3, bool)).verdict == "no token passes the bound"


def test_step_metrics_names_and_values():
    engine = np.array([[[1, 2]], [[3, 4]]])
    actor = np.array([[[1, 2]], [[3, 5]]])
    m = step_metrics(engine, actor, prob_diff=np.array([0.0, 0.4]))
    assert m["rollout/routing_disagreement"] == 0.5
    assert m["rollout/mismatch_routing_share"] == 1.0
    assert m["rollout/mismatch_diff_mean_routed_differently"] == pytest.approx(0.4)
