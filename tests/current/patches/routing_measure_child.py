"""One gloo rank measuring MoE routing disagreement with verl 0.9.1's Megatron engine on a padded (BSHD) batch.

python tests/current/patches/routing_measure_child.py <port> <hf model dir> <out dir>

The tiny local-spec DeepSeek-V3 of mcore_child with verl's router-replay patch; verl's own
MegatronEngineWithLMHead.forward_backward_batch (forward only, padded batches as the CPU recipes run them):

- R2's record of the actor's own routes, two sequences in one micro-batch and each alone;
- `router_replay.measure` with mode disabled and with R3, given "rollout routes" equal to the actor's own
  except at chosen rows, where one expert is swapped for another;
- the log-probs of each (measure must not change what is replayed).

Writes <out dir>/measure.pt.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from tests.current.patches import r3_child  # noqa: E402

LENGTHS = [7, 4]  # prompt + response tokens of each sequence
RESPONSE = [3, 2]  # response tokens of each
FLIPPED = {
    0: [2, 4, 5],
    1: [2],
}  # rows whose rollout route is changed: sequence -> rows (a prompt row included)


def _with_mode(engine, mode: str, measure: bool):
    from dataclasses import replace

    from verl.workers.config.engine import EngineRouterReplayConfig

    config = EngineRouterReplayConfig(mode=mode, measure=measure)
    engine.engine_config = replace(engine.engine_config, router_replay=config)
    return engine


def main() -> int:
    port, hf_dir, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    hf, model, engine = r3_child.replay_engine(port, hf_dir)
    with torch.no_grad():  # routes that vary from token to token (not the expert bias's alone): a layout test
        for name, p in model.named_parameters():
            if name.endswith("router.weight"):
                p.mul_(25.0)
        for name, b in model.named_buffers():
            if name.endswith("router.expert_bias"):
                b.zero_()
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(1, hf["vocab_size"], (n,), generator=g) for n in LENGTHS]
    experts = hf["n_routed_experts"]

    # the actor's own routes: R2 records them (a forward-only pass without rollout routes)
    recorded = r3_child.forward(_with_mode(engine, "R2", False), seqs, None, RESPONSE, replay=True)[
        "routed_experts"
    ]
    alone = [
        r3_child.forward(engine, [s], None, [n], replay=True)["routed_experts"][0]
        for s, n in zip(seqs, RESPONSE, strict=True)
    ]
    # the rollout's, as vLLM returns them: every layer (the dense ones' rows zero, the actor records its MoE
    # layers only), the actor's own routes in the MoE layers but one expert swapped for one the row did not
    # pick at the FLIPPED rows; no route for the last token it generated (verl aligns that)
    moe = [i for i in range(hf["num_hidden_layers"]) if i >= hf["first_k_dense_replace"]]
    assert (
        recorded[0].shape[1] == len(moe) < hf["num_hidden_layers"]
    ), "want a dense layer before the MoE ones"
    rollout = []
    for i, own in enumerate(recorded):
        r = torch.zeros(len(own) - 1, hf["num_hidden_layers"], own.shape[2], dtype=own.dtype)
        r[:, moe] = own[:-1]
        for row in FLIPPED[i]:
            for layer in moe:
                unused = [e for e in range(experts) if e not in r[row, layer].tolist()]
                r[row, layer, 0] = unused[0]
        rollout.append(r)
    measured = r3_child.forward(_with_mode(engine, "disabled", True), seqs, rollout, RESPONSE, replay=True)
    measured_r3 = r3_child.forward(_with_mode(engine, "R3", True), seqs, rollout, RESPONSE, replay=True)
    plain_r3 = r3_child.forward(_with_mode(engine, "R3", False), seqs, rollout, RESPONSE, replay=True)
    native = r3_child.forward(_with_mode(engine, "disabled", False), seqs, None, RESPONSE, replay=False)
    torch.save(
        {
            "lengths": LENGTHS,
            "response": RESPONSE,
            "flipped": FLIPPED,
            "recorded": recorded,
            "alone": alone,
            "measured": measured,
            "measured_r3": measured_r3,
            "plain_r3": plain_r3,
            "native": native,
        },
        os.path.join(out, "measure.pt"),
    )
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
