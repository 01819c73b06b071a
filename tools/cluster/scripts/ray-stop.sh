#!/usr/bin/env bash
# Stop this node's Ray processes of the ascend-r1 cluster (its temp dir only; other Ray clusters stay).
#   tools/cluster/scripts/ray-stop.sh [--temp-dir DIR]
set -euo pipefail
# shellcheck source=SCRIPTDIR/checkout.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/checkout.sh"  # $repo (the working directory), $python
exec "$python" -m tools.launch cluster stop "$@"
