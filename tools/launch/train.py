"""`make train`: launch the main job for a profile.

The launch work (Ray start, preflight, recipe configs, the CPU path through verl) has not landed yet.
Until it does, this says exactly what is missing instead of pretending to train.
"""

from __future__ import annotations

import argparse
import sys

MISSING = """\
make train: the training launcher is not implemented yet.
Missing pieces (not built yet):
  - patches/verl: the CPU path (gloo backend, HF rollout, device stand-in) so verl's GRPO runs on CPU
  - tools/launch: Ray cluster start, preflight checks, recipe configs (model x hardware x algorithm)
  - a tiny local model, tokenizer and dataset for the CPU profile
What works today: make bootstrap, make apply-patches, make check-patches, make test,
the weight converters (python -m tools.weights --help) and data/reward tools (python -m tools.data --help).
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default=None)
    parser.parse_args(argv)
    sys.stderr.write(MISSING)
    return 2


if __name__ == "__main__":
    sys.exit(main())
