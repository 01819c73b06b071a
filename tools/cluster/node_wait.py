"""`make ray-job`'s supervisor on a cluster: the nodes a run had, the ones it lost, and a bounded wait for
them (or replacements) before a restart.

`make ray-job` runs `make train`'s supervisor (tools/launch/train.py) with verl's driver attached to the
cluster at HEAD. Before each attempt the supervisor notes the cluster's alive nodes. When an attempt fails, a
node alive then and not now names the fault: `node lost`, the node's address and Ray id. Before a restart the
supervisor waits up to `launch.ray.node_wait_s` seconds (default NODE_WAIT_S) for `launch.nodes` nodes with
`launch.devices_per_node` of `launch.ray.resource` each: the lost node back, or a replacement (KubeRay
starts a new pod for a lost one; a Slurm node's worker step joins again when its raylet ended). When they are
not there in time there is no restart: exit 3, naming the node. tests/tools/cluster/test_node_wait.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tools.cluster.ray_cluster import ClusterError, Node, cluster_nodes, wait_for
from tools.errors import UserError
from tools.launch.restart import Fault

# Ray's GCS marks a node whose raylet went silent dead after its health checks fail (5 x 3 s and their
# timeouts); verl's driver may fail sooner (ActorUnavailableError on the closed socket): a fault is looked at
# this long for a node that goes dead
DEATH_S = 40.0
NODE_WAIT_S = 900.0  # a Slurm node's reboot or a KubeRay pod rescheduled (an image pull included): minutes
KEY = "launch.ray.node_wait_s"


def _ident(n: Node) -> str:
    return n.node_id or n.address


def name(n: Node) -> str:
    """A node as a line names it: its address, and Ray's id where one machine runs several raylets."""
    return f"{n.address} (Ray node {n.node_id[:12]})" if n.node_id else n.address


@dataclass(frozen=True)
class Cluster:
    """The cluster at `address` as a recipe needs it: `nodes` alive nodes, `devices` of `resource` each."""

    address: str
    nodes: int
    devices: int
    resource: str
    wait_s: float
    lister: Callable[[str, str], list[Node]] = cluster_nodes
    poll_s: float = 5.0
    death_s: float = DEATH_S

    @classmethod
    def of(cls, launch: Any, address: str) -> Cluster:
        """From a recipe's launch section; a bad launch.ray.node_wait_s is refused naming the key."""
        ray = launch.get("ray") or {}
        wait = ray.get("node_wait_s", NODE_WAIT_S)
        if isinstance(wait, bool) or not isinstance(wait, int | float) or wait <= 0:
            raise UserError(
                f"{KEY}: {wait!r}",
                fix=f"seconds > 0 a restart waits for a lost node or its replacement, e.g. ARGS='{KEY}=900'",
            )
        # the dashboard that lists the nodes (ray_cluster.cluster_nodes): --dashboard-port, else the recipe's
        os.environ.setdefault("ASCEND_R1_RAY_DASHBOARD_PORT", str(ray.get("dashboard_port", 8265)))
        return cls(address, int(launch.get("nodes", 1)), int(launch.get("devices_per_node", 1)),
                   str(ray.get("resource", "NPU")), float(wait))  # fmt: skip

    def alive(self) -> list[Node]:
        """The alive nodes now (none when the cluster does not answer)."""
        try:
            return [n for n in self.lister(self.address, self.resource) if n.alive]
        except ClusterError:
            return []

    def ready(self) -> list[Node]:
        """Before the first attempt: wait up to wait_s for the nodes the recipe needs; the ClusterError that
        names the missing ones (exit 2: the cluster is the user's to start) when they do not all join."""
        return wait_for(self.address, self.nodes, self.devices, self.resource, self.wait_s,
                        poll=self.poll_s, lister=self.lister)  # fmt: skip

    def lost(self, before: Sequence[Node]) -> list[Node]:
        """The nodes alive before the attempt that are not alive now (none when the cluster does not answer:
        a dashboard that does not answer loses no node)."""
        try:
            now = {_ident(n) for n in self.lister(self.address, self.resource) if n.alive}
        except ClusterError:
            return []
        return [n for n in before if _ident(n) not in now]

    def name_lost(self, fault: Fault, before: Sequence[Node]) -> Fault:
        """A fault during which a node left the cluster is that node's loss, whatever verl's driver said
        (looked for up to death_s: Ray marks a silent node dead some seconds after verl's driver failed)."""
        if fault.kind in ("config", "data"):
            return fault
        gone = self.lost(before)
        deadline = time.monotonic() + self.death_s
        while not gone and time.monotonic() < deadline:
            time.sleep(self.poll_s)
            gone = self.lost(before)
        if not gone:
            return fault
        who = ", ".join(name(n) for n in gone)
        return replace(fault, kind="node lost", process=f"node {who}", line=fault.line or f"node {who} left")

    def wait_back(self, fault: Fault) -> str | None:
        """Before a restart: None once the cluster has the nodes the recipe needs again (at once when no node
        was lost), else why there is no restart (one line, naming the lost node)."""
        try:
            wait_for(self.address, self.nodes, self.devices, self.resource, self.wait_s,
                     poll=self.poll_s, lister=self.lister)  # fmt: skip
            return None
        except ClusterError as e:
            have = str(e).splitlines()[0]  # "after W s, k of N nodes joined with D R each"
            lost = fault.process if fault.kind == "node lost" else "a node"
            return (
                f"{lost} lost, and neither it nor a replacement with {self.devices} {self.resource}"
                " joined within"
                f" {self.wait_s:g} s ({KEY}): {have}"
            )
