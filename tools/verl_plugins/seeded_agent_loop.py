"""verl 0.9.1's single-turn agent loop with a seed on every rollout request (opt-in: recipes/seeded_rollout.yaml's
overrides, `make bench-faults`' seeded cases).

Without it each vLLM request draws its sampling noise from the engine's one generator, seeded once when the
engine starts (verl/workers/rollout/vllm_rollout/vllm_async_server.py: `seed` = rollout.seed + replica rank;
vllm/v1/sample/ops/topk_topp_sampler.py `random_sample`: `q.exponential_()` for requests without a generator),
in the order requests reach the engine: two runs of the same seed sample other responses, and a resumed run's
engine starts that generator again. verl's own `rollout.full_determinism` gives every request the same seed,
so a prompt's rollout.n responses would be the same response. Here a request's seed is a hash of the rollout
seed, the step it was fetched for, the prompt (its data row's extra_info index) and the response's place in
its group (verl's session id): the same step samples the same responses whatever the order, the engine's
history or a restart in between.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput  # noqa: E402
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop  # noqa: E402

NAME = "seeded_single_turn_agent"


def request_seed(seed: Any, step: Any, prompt: Any, session: Any) -> int:
    """A 63-bit seed from the rollout seed, the step, the prompt id and the response's place in its group."""
    key = f"{seed}/{step}/{prompt}/{session}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        step, prompt, session = kwargs.get("global_steps"), kwargs.get("index"), kwargs.get("session_id", 0)
        seeded = dict(sampling_params)
        seeded.setdefault("seed", request_seed(self.rollout_config.seed, step, prompt, session))
        return await super().run(seeded, priority, **kwargs)
