"""Weight conversion for DeepSeek-V3: FP8 -> BF16, HF -> Megatron torch_dist, Megatron -> HF.

Run `python -m tools.weights --help`. See docs/weights.md.
"""
