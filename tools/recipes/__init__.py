"""Recipe composition: recipes/*.yaml through Hydra into verl's config and command line (recipe), the Megatron
fields verl lacks (mcore_fields) and the rollout modes (mode)."""
