#!/usr/bin/env bash
# Start the Ray head of a recipe on this node and wait until every node of the recipe has joined.
#   tools/cluster/scripts/ray-head.sh <recipe> [extra `python -m tools.launch cluster` head options]
# The node address comes from HCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME (else Ray's own choice); the
# recipe's launch.env is exported for every Ray worker on this node. Exit 2 with the missing nodes named
# when they do not all join within --wait-timeout (default 900 s).
set -euo pipefail
# shellcheck source=SCRIPTDIR/checkout.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/checkout.sh"  # $repo (the working directory), $python
if [[ $# -lt 1 ]]; then
    echo "usage: $0 <recipe> [--wait-timeout S] [--expect host1,host2,...]" >&2
    exit 2
fi
recipe=$1
shift
exec "$python" -m tools.launch cluster head --recipe "$recipe" "$@"
