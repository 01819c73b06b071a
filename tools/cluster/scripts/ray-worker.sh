#!/usr/bin/env bash
# Join this node to the Ray head of a recipe, with bounded retries (default 30 x 10 s).
#   tools/cluster/scripts/ray-worker.sh <recipe> <head-ip:port> [extra `python -m tools.launch cluster` worker options]
set -euo pipefail
# shellcheck source=SCRIPTDIR/checkout.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/checkout.sh"  # $repo (the working directory), $python
if [[ $# -lt 2 ]]; then
    echo "usage: $0 <recipe> <head-ip:port> [--retries N] [--delay S]" >&2
    exit 2
fi
recipe=$1
head=$2
shift 2
exec "$python" -m tools.launch cluster worker --recipe "$recipe" --address "$head" "$@"
