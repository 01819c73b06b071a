"""MoE routing between the rollout engine and the trainer: disagreement, its share of the mismatch,
what routing replay costs (docs/routing-replay.md)."""
