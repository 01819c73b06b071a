"""What routing replay (R3) costs: the routed expert ids carried from the rollout to the trainer each step.

Where they live, in verl 0.9.1 + vLLM (file:line in docs/routing-replay.md):
- vLLM engine, per rank: a device buffer [max_num_batched_tokens, layers, k] int32 and its pinned host copy
  (RoutedExpertsCapturer), and per engine (scheduler, host) a slot buffer [KV-cache slots, layers, k] uint8
  (uint16 above 256 experts; RoutedExpertsManager) that keeps every cached token's ids until its request ends.
- verl's agent loop: each sample's ids padded to max_prompt_length + max_response_length, int16, into the
  step's batch (host; the driver and Ray's object store): samples x (prompt + response) x layers x k x 2 B.
- the actor: each data-parallel rank receives its samples' share (host), and each micro-batch's ids go to the
  device for the replay (int16 as carried; the per-layer targets are a small fraction of the activations).
`layers` is the model's whole depth: vLLM sizes the capture by num_hidden_layers, dense layers included.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.errors import UserError

GB = 1e9
VERL_ID_BYTES = 2  # agent_loop.py: routed_experts .to(torch.int16)
VLLM_TRANSIT_ID_BYTES = 4  # RoutedExpertsCapturer: int32 device / pinned buffers


@dataclass(frozen=True)
class ReplayCost:
    samples: int  # train_batch_size x rollout.n
    seq: int  # max_prompt_length + max_response_length (verl pads every sample to it)
    layers: int
    top_k: int
    n_experts: int
    actor_dp: int
    ranks_per_dp_group: int  # TP x PP x CP
    micro_batch: int
    max_num_batched_tokens: int
    kv_slots_per_engine: int | None  # tokens of one engine's KV cache (the planner's memory model)
    engines_per_node: int
    host_bw: float  # bytes/s device <-> host, per rank
    network_bw: float  # bytes/s between nodes, per rank (the driver -> actor hand-over)

    @property
    def ids_per_token(self) -> int:
        return self.layers * self.top_k

    @property
    def step_bytes(self) -> int:
        """The step's batch of routed ids as verl carries it (host)."""
        return self.samples * self.seq * self.ids_per_token * VERL_ID_BYTES

    @property
    def actor_rank_bytes(self) -> int:
        """One actor data-parallel rank's share (host; every TP/PP/CP rank of the group receives it)."""
        return -(-self.samples // self.actor_dp) * self.seq * self.ids_per_token * VERL_ID_BYTES

    @property
    def micro_batch_device_bytes(self) -> int:
        return self.micro_batch * self.seq * self.ids_per_token * VERL_ID_BYTES

    @property
    def engine_device_bytes(self) -> int:
        """vLLM's capture buffer per rank (device), the same again pinned on the host."""
        return self.max_num_batched_tokens * self.ids_per_token * VLLM_TRANSIT_ID_BYTES

    @property
    def slot_id_bytes(self) -> int:
        return 1 if self.n_experts <= 256 else 2

    @property
    def engine_slot_bytes(self) -> int | None:
        """vLLM's scheduler slot buffer per engine (host), sized by the KV cache."""
        if self.kv_slots_per_engine is None:
            return None
        return self.kv_slots_per_engine * self.ids_per_token * self.slot_id_bytes

    @property
    def world(self) -> int:
        return self.actor_dp * self.ranks_per_dp_group

    @property
    def driver_send_bytes(self) -> int:
        """What the driver sends the actor a pass: every rank of a data-parallel group gets its group's
        share (verl's Megatron dispatch)."""
        return self.actor_rank_bytes * self.world

    @property
    def host_to_device_s(self) -> float:
        """One actor rank's share to the device, once per pass (old log-prob, then update: x2)."""
        return 2 * self.actor_rank_bytes / self.host_bw

    @property
    def handover_s(self) -> float:
        """The driver's sends for both passes through one rank's scale-out link (an ASSUMPTION: the
        driver is one process on one node; a bound, not a measurement)."""
        return 2 * self.driver_send_bytes / self.network_bw

    def rows(self) -> list[tuple[str, str]]:
        """(rule, values) for the planner's table."""
        ids = self.samples * self.seq * self.ids_per_token
        out = [
            (
                "routed ids a step",
                f"{ids:,} = {self.samples} samples x {self.seq} tokens (prompt + response, padded) x "
                f"{self.layers} layers x top-{self.top_k}",
            ),
            (
                "step batch (host)",
                f"{self.step_bytes / GB:.2f} GB int16 in the driver's batch (Ray object store)",
            ),
            (
                "actor rank share",
                f"{self.actor_rank_bytes / GB:.3f} GB a rank (host, {self.actor_dp} DP groups of "
                f"{self.ranks_per_dp_group}); {self.micro_batch_device_bytes / 1e6:.1f} MB to the device a "
                f"micro-batch of {self.micro_batch}",
            ),
            (
                "vLLM capture buffer",
                f"{self.engine_device_bytes / 1e6:.1f} MB a rank (device, int32) + the same pinned (host)",
            ),
        ]
        slot = self.engine_slot_bytes
        if slot is not None:
            out.append(
                (
                    "vLLM slot buffer (host)",
                    f"{slot / GB:.2f} GB an engine ({self.kv_slots_per_engine:,} KV slots x "
                    f"{self.ids_per_token} ids x {self.slot_id_bytes} B) x {self.engines_per_node} engines "
                    f"= {slot * self.engines_per_node / GB:.1f} GB a node",
                )
            )
        out.append(
            (
                "replay transfer time",
                f"host->device {self.host_to_device_s:.3f} s a step (2 passes, {self.host_bw / GB:.0f} GB/s); "
                f"driver -> actor {self.driver_send_bytes / GB:.1f} GB a pass, {self.handover_s:.1f} s a step "
                f"through one {self.network_bw / GB:.0f} GB/s link (a bound)",
            )
        )
        return out


def check(ctx) -> None:  # ctx: tools.plan.context.Context
    """The planner's rule: where routing replay or its measurement (router_replay.measure, which carries the
    same ids) is on, note what it carries (INFO, never a failure)."""
    mode = ctx.get("actor_rollout_ref.actor.megatron.router_replay.mode", "disabled")
    measure = bool(ctx.get("actor_rollout_ref.actor.megatron.router_replay.measure", False))
    if (mode in (None, "disabled") and not measure) or ctx.arch is None:
        return
    if mode in (None, "disabled"):
        mode = "measure"
    a = ctx.arch
    if not a.moe:
        ctx.add(
            "routing",
            "routing replay",
            False,
            f"mode {mode}",
            "routing replay needs a mixture-of-experts model",
        )
        return
    cost = from_context(ctx)
    if cost is None:
        ctx.skip("routing", "routing replay cost", "the batch or layout is invalid (see above)")
        return
    for rule, values in cost.rows():
        ctx.note("routing", f"{mode}: {rule}", values)
    if measure:
        ctx.note(
            "routing",
            "measure: the actor's routes",
            f"at most {cost.actor_rank_bytes / GB:.3f} GB a rank (host, int16) recorded in the old-log-prob pass "
            "beside the rollout's, reduced to one flag a token (rollout/routing_disagreement)",
        )


def from_context(ctx) -> ReplayCost | None:
    # tools.plan imports this module: at the top, tools.plan.hardware would close a circle through it
    from tools.plan.hardware import chip_for

    lay, a = ctx.layout, ctx.arch
    try:
        samples = int(ctx.get("data.train_batch_size")) * int(ctx.get("actor_rollout_ref.rollout.n"))
        seq = int(ctx.get("data.max_prompt_length")) + int(ctx.get("data.max_response_length"))
        micro = int(ctx.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") or 1)
        mnbt = int(ctx.get("actor_rollout_ref.rollout.max_num_batched_tokens"))
    except (TypeError, ValueError):
        return None
    if lay is None or not ctx.rollout_tp or samples <= 0 or seq <= 0 or micro <= 0:
        return None  # a bad batch is the batch rules' FAIL line; no cost of it
    try:
        chip = chip_for(str(ctx.launch_get("hardware", "")))
    except UserError:  # hardware without figures: the bytes still count, the times are not shown
        return None
    host_bw, net_bw = chip.host_bw.value, chip.scaleout_bw.value
    kv_slots = None
    if ctx.estimate is not None and ctx.estimate.kv_available > 0:
        # tools.plan imports this module: at the top, tools.plan.params would close a circle through it
        from tools.plan.params import kv_bytes_per_token

        kv_slots = ctx.estimate.kv_available // kv_bytes_per_token(a, ctx.rollout_tp)
    per_node = int(ctx.launch_get("devices_per_node", 1) or 1)
    return ReplayCost(
        samples=samples,
        seq=seq,
        layers=a.num_hidden_layers,
        top_k=a.num_experts_per_tok,
        n_experts=a.n_routed_experts,
        actor_dp=lay.dp,
        ranks_per_dp_group=lay.tp * lay.pp * lay.cp,
        micro_batch=micro,
        max_num_batched_tokens=mnbt,
        kv_slots_per_engine=kv_slots,
        engines_per_node=max(per_node // ctx.rollout_tp, 1),
        host_bw=host_bw,
        network_bw=net_bw,
    )
