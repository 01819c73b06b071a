#!/usr/bin/env bash
# Stop this node's Ray processes of the ascend-r1 cluster (its temp dir only; other Ray clusters stay).
#   tools/launch/scripts/ray-stop.sh [--temp-dir DIR]
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd -- "$here/../../.." && pwd)
python=${PYTHON:-$repo/$(cd -- "$repo" && python3 -m tools.stacks venv)/bin/python}  # the stack's environment (STACK=, ASCEND_R1_STACK)
cd -- "$repo"
exec "$python" -m tools.launch cluster stop "$@"
