"""The seeded rollout (tools/verl_plugins/seeded_agent_loop.py): each request's seed depends on the rollout seed,
the step, the prompt and the response's place in its group only, so that a resumed step samples as the
uninterrupted one did; a prompt's responses get different seeds (verl's full_determinism gives them one)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from tools.verl_plugins import seeded_agent_loop as S

pytestmark = pytest.mark.upstream


def test_a_request_seed_is_a_function_of_step_prompt_and_place_in_the_group():
    seeds = {
        S.request_seed(42, step, prompt, session)
        for step in (1, 2)
        for prompt in (5, 6)
        for session in (0, 1)
    }
    assert len(seeds) == 8  # every (step, prompt, response) its own
    assert S.request_seed(42, 2, 5, 1) == S.request_seed(42, 2, 5, 1)  # the same after a restart
    assert S.request_seed(43, 2, 5, 1) != S.request_seed(42, 2, 5, 1)  # the rollout seed still counts
    assert all(0 <= s < 2**63 for s in seeds)


def test_the_agent_loop_hands_verl_s_loop_the_seeded_sampling_params(monkeypatch):
    seen = []

    async def run(self, sampling_params, priority=0, **kwargs):
        seen.append(sampling_params)

    monkeypatch.setattr(SingleTurnAgentLoop, "run", run)
    loop = object.__new__(S.SeededSingleTurnAgentLoop)
    loop.rollout_config = SimpleNamespace(seed=42)
    params = {"temperature": 1.0}
    for session in (0, 1):
        asyncio.run(loop.run(params, global_steps=3, index=7, session_id=session, raw_prompt=[]))
    assert [p["seed"] for p in seen] == [S.request_seed(42, 3, 7, 0), S.request_seed(42, 3, 7, 1)]
    assert params == {"temperature": 1.0}  # verl's dict, shared by the group's requests, is left alone
