# shellcheck shell=bash
# Sourced by the ray-*.sh scripts (set -euo pipefail): $repo, the checkout, made the working directory,
# and $python, the stack's environment (STACK=, ASCEND_R1_STACK; PYTHON= overrides it).
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../../.." && pwd)
# shellcheck disable=SC2034  # read by the scripts that source this file
python=${PYTHON:-$repo/$(cd -- "$repo" && python3 -m tools.stacks venv)/bin/python}
cd -- "$repo" || exit 2
