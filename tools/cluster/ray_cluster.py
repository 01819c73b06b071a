"""Ray cluster start and stop for a recipe: the head, the workers, waiting for N nodes x M devices, a clean stop.

    python -m tools.launch cluster address                       # the address this node would use
    python -m tools.launch cluster head   --nodes 16 --devices 16 --resource NPU [--wait-timeout 900]
    python -m tools.launch cluster worker --address 10.0.0.1:6766 --devices 16 --resource NPU
    python -m tools.launch cluster wait   --address 10.0.0.1:6766 --nodes 16 --devices 16 --resource NPU
    python -m tools.launch cluster stop                          # this cluster's processes only

The node address comes from the interface named by HCCL_SOCKET_IFNAME (else GLOO_SOCKET_IFNAME), read
with the SIOCGIFADDR ioctl; with neither set, Ray picks its own. No probe of a public address and no
parsing of `ifconfig`. Workers join with bounded retries; the head waits for every node with a timeout
and names the nodes that are missing or short of devices. `stop` ends only the processes of this
cluster's Ray temp dir (RAY_TMPDIR-like `--temp-dir`, default /tmp/ascend-r1-ray), SIGTERM then SIGKILL,
and checks that none is left: other Ray clusters of the same user on the machine are not touched
(`ray stop` would end them all).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import atomic
from tools.errors import UserError, run_cli
from tools.launch.procs import terminate

DEFAULT_TEMP = "/tmp/ascend-r1-ray"
IFNAME_VARS = ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
SIOCGIFADDR = 0x8915


class ClusterError(UserError):
    pass


def interface_address(ifname: str) -> str:
    """IPv4 address of a network interface (Linux ioctl SIOCGIFADDR)."""
    if not Path("/sys/class/net", ifname).exists():
        names = ", ".join(sorted(os.listdir("/sys/class/net"))) if Path("/sys/class/net").is_dir() else "?"
        raise ClusterError(
            f"network interface {ifname!r} does not exist on {socket.gethostname()}",
            fix=f"set HCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to one of: {names}",
        )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
        except OSError as e:
            raise ClusterError(
                f"interface {ifname!r} has no IPv4 address ({e.strerror})",
                fix="name the interface of the cluster network (with an IPv4 address)",
            ) from None
    return socket.inet_ntoa(packed[20:24])


def node_address(env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(address or None, where it came from). None: let Ray choose its own node address."""
    env = os.environ if env is None else env
    for var in IFNAME_VARS:
        value = env.get(var, "").strip()
        if value:
            ifname = value.split(",")[0].strip().lstrip("^=")  # gloo accepts a list; NCCL-style prefixes
            return interface_address(ifname), f"{var}={value}"
    return None, "Ray's own choice (no HCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME set)"


def ray_env(recipe_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for `ray start` (its workers inherit it) and `ray job submit`.

    The recipe's launch.env is exported here so that every Ray worker on the node sees HCCL_*, VLLM_* etc.
    RAY_AUTH_MODE: Ray >= 2.5x turns token authentication on whenever ~/.ray/auth_token exists, and then a
    node without the same token cannot join. Unless you set RAY_AUTH_MODE yourself (token: also set
    RAY_AUTH_TOKEN on every node), the cluster runs with it disabled, like the published scripts' Ray.
    """
    env = dict(os.environ)
    env.update(recipe_env or {})
    env.setdefault("RAY_AUTH_MODE", "disabled")
    return env


def ray_exe() -> str:
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else "ray"


@dataclass
class Node:
    address: str
    alive: bool
    devices: float
    node_id: str = ""  # Ray's node id: two raylets of one machine share an address


def _start_args(args: argparse.Namespace, ip: str | None) -> list[str]:
    cmd = [ray_exe(), "start", "--disable-usage-stats", f"--temp-dir={args.temp_dir}"]
    if ip:
        cmd.append(f"--node-ip-address={ip}")
    if args.resource and args.resource.upper() != "CPU":
        cmd += [f"--resources={json.dumps({args.resource: args.devices})}", "--num-gpus=0"]
    if args.num_cpus is not None:
        cmd.append(f"--num-cpus={args.num_cpus}")
    for flag in args.ray_arg or []:
        cmd.append(flag)
    return cmd


def _run(
    cmd: Sequence[str], timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env or ray_env())


def start_head(args: argparse.Namespace) -> str:
    ip, source = node_address()
    cmd = _start_args(args, ip) + [
        "--head",
        f"--port={args.port}",
        "--include-dashboard=true",
        f"--dashboard-port={args.dashboard_port}",
        "--dashboard-host=0.0.0.0",
    ]
    print(f"head: node address {ip or '(Ray chooses)'} from {source}", flush=True)
    res = _run(cmd, env=ray_env(args.env))
    if res.returncode != 0:
        raise ClusterError(
            f"`ray start --head` failed ({res.returncode}):\n{_tail(res)}",
            fix=f"is port {args.port} free? `python -m tools.launch cluster stop` ends a previous head",
        )
    address = f"{ip or _ray_reported_ip(res.stdout) or '127.0.0.1'}:{args.port}"
    print(
        f"head started at {address}; workers: python -m tools.launch cluster worker --address {address}",
        flush=True,
    )
    return address


def _ray_reported_ip(out: str) -> str | None:
    for line in out.splitlines():
        if "Local node IP:" in line:
            return line.split("Local node IP:")[1].strip().split()[0]
    return None


def _text(x: str | bytes | None) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def _tail(res: subprocess.CompletedProcess, n: int = 15) -> str:
    return "\n".join((res.stdout + res.stderr).strip().splitlines()[-n:])


def start_worker(args: argparse.Namespace) -> None:
    ip, source = node_address()
    cmd = _start_args(args, ip) + [f"--address={args.address}"]
    print(f"worker: node address {ip or '(Ray chooses)'} from {source}; joining {args.address}", flush=True)
    last = None
    for attempt in range(1, args.retries + 1):
        try:
            res = _run(cmd, timeout=args.attempt_timeout, env=ray_env(args.env))
        except subprocess.TimeoutExpired as e:  # ray start keeps retrying a head it cannot reach
            res = subprocess.CompletedProcess(
                cmd,
                124,
                _text(e.stdout),
                _text(e.stderr) + f"\n(no answer within {args.attempt_timeout:g} s)",
            )
        if res.returncode == 0:
            print(f"worker joined {args.address} (attempt {attempt})", flush=True)
            return
        last = res
        print(
            f"attempt {attempt}/{args.retries} to join {args.address} failed; retrying in {args.delay:g} s",
            flush=True,
        )
        stop(args.temp_dir, quiet=True)  # a half-started raylet must not linger between attempts
        time.sleep(args.delay)
    raise ClusterError(
        f"could not join the Ray head at {args.address} after {args.retries} attempts:\n{_tail(last) if last else ''}",
        fix="start the head first (make ray-head), check that this node reaches it on the cluster network "
        "(the port is open, HCCL_SOCKET_IFNAME names the right interface) and that Ray versions match",
    )


def hold(temp_dir: str, poll: float = 10.0) -> None:
    """Block while this node's raylet of `temp_dir` runs (it ends when the head goes away or on stop)."""

    def raylet_running() -> bool:
        return any("raylet" in (p.info["cmdline"] or [""])[0] for p in _our_processes(str(Path(temp_dir))))

    while raylet_running():
        time.sleep(poll)
    print("raylet ended; leaving", flush=True)


def cluster_nodes(address: str, resource: str) -> list[Node]:
    """Alive and dead nodes of the cluster with their count of `resource` (GCS, without a driver)."""
    from ray.util.state import list_nodes  # noqa: F401  (import checks the Ray install early)

    out = _run(
        [ray_exe(), "list", "nodes", "--format=json", f"--address={_dashboard(address)}", "--limit=10000"],
        timeout=60,
    )
    if out.returncode != 0:
        raise ClusterError(f"cannot list the nodes of {address}:\n{_tail(out)}")
    nodes = []
    for n in json.loads(out.stdout or "[]"):
        res = n.get("resources_total") or {}
        nodes.append(
            Node(
                n.get("node_ip") or n.get("node_ip_address") or "?",
                n.get("state") == "ALIVE",
                float(res.get(resource, 0)),
                n.get("node_id") or "",
            )
        )
    return nodes


def _dashboard(address: str) -> str:
    host = address.split(":")[0]
    port = os.environ.get("ASCEND_R1_RAY_DASHBOARD_PORT", "8265")
    return f"http://{host}:{port}"


def wait_for(
    address: str,
    nodes: int,
    devices: int,
    resource: str,
    timeout: float,
    expect: Sequence[str] = (),
    poll: float = 2.0,
    lister=cluster_nodes,
) -> list[Node]:
    """Block until `nodes` alive nodes each with >= `devices` of `resource`; name the missing ones on timeout."""
    deadline = time.monotonic() + timeout
    seen: list[Node] = []
    shown = -1
    while True:
        try:
            seen = [n for n in lister(address, resource) if n.alive]
        except ClusterError:
            seen = []
        ready = [n for n in seen if n.devices >= devices]
        if len(ready) >= nodes:
            print(f"cluster ready: {len(ready)} nodes x {devices} {resource}", flush=True)
            return ready
        if len(ready) != shown:
            print(
                f"waiting: {len(ready)} of {nodes} nodes with {devices} {resource} "
                f"({max(0, deadline - time.monotonic()):.0f} s left)",
                flush=True,
            )
            shown = len(ready)
        if time.monotonic() >= deadline:
            break
        time.sleep(poll)
    raise ClusterError(
        missing_message(seen, nodes, devices, resource, timeout, expect),
        fix="start `make ray-worker` on the missing nodes (HEAD= this address), or fix their "
        "device count; then run the wait again",
    )


def missing_message(
    seen: Sequence[Node], nodes: int, devices: int, resource: str, timeout: float, expect: Sequence[str]
) -> str:
    ready = [n for n in seen if n.devices >= devices]
    short = [n for n in seen if n.devices < devices]
    lines = [f"after {timeout:g} s, {len(ready)} of {nodes} nodes joined with {devices} {resource} each"]
    if ready:
        lines.append("joined: " + ", ".join(sorted(n.address for n in ready)))
    if short:
        lines.append(
            "short of devices: " + ", ".join(f"{n.address} ({n.devices:g} {resource})" for n in short)
        )
    if expect:
        joined = {n.address for n in seen}
        missing = [h for h in expect if _resolve(h) not in joined and h not in joined]
        lines.append("missing: " + (", ".join(missing) if missing else "none of the expected hosts"))
    else:
        lines.append(f"missing: {nodes - len(ready)} node(s) (pass --expect host1,host2,... to name them)")
    return "\n".join(lines)


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _our_processes(temp_dir: str):
    import psutil

    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if p.info["pid"] != me and (temp_dir + "/" in cmd or cmd.endswith(temp_dir) or temp_dir + " " in cmd):
            yield p


def stop(temp_dir: str = DEFAULT_TEMP, grace: float = 10.0, quiet: bool = False) -> int:
    """End every process of the Ray cluster living in `temp_dir`; returns how many were ended."""
    import psutil

    temp_dir = str(Path(temp_dir))
    procs = list(_our_processes(temp_dir))
    # and what they started that does not name the temp dir (a job's entrypoint shell and its driver)
    seen = {p.pid for p in procs}
    for p in list(procs):
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in p.children(recursive=True):
                if child.pid not in seen:
                    seen.add(child.pid)
                    procs.append(child)
    terminate(procs, grace)
    # workers started while we stopped the others (raylet respawns): a second pass, no grace
    late = list(_our_processes(temp_dir))
    terminate(late, 0)
    left = list(_our_processes(temp_dir))
    if left:
        raise ClusterError(
            f"Ray processes of {temp_dir} still running: {[p.pid for p in left]}",
            fix="they may belong to another user; check with ps",
        )
    if not quiet:
        print(f"stopped {len(procs) + len(late)} Ray processes of {temp_dir}; none left", flush=True)
    return len(procs) + len(late)


def _apply_recipe(args: argparse.Namespace) -> None:
    """Fill node settings from a recipe: devices, Ray resource and port, node count, exported env."""
    args.env = None
    if not getattr(args, "recipe", None):
        return
    from tools.recipes.recipe import compose, verl_env  # Hydra: only when a recipe names the settings

    cfg = compose(args.recipe, args.set or [])
    launch = cfg.launch
    ray = launch.get("ray") or {}
    if args.devices is None:
        args.devices = int(launch.devices_per_node)
    if args.resource is None:
        args.resource = str(ray.get("resource", "NPU"))
    if hasattr(args, "port") and args.port is None:
        args.port = int(ray.get("port", 6766))
    if hasattr(args, "dashboard_port") and args.dashboard_port is None:
        args.dashboard_port = int(ray.get("dashboard_port", 8265))
    if hasattr(args, "nodes") and not args.nodes:
        args.nodes = int(launch.nodes)
    args.env = verl_env(cfg)


def _hosts(expect: str) -> list[str]:
    return [h for h in expect.split(",") if h]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.launch cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("address", help="print the node address (and where it comes from)")

    def common(sp):
        sp.add_argument("--recipe", help="take devices, Ray resource, port, nodes and env from this recipe")
        sp.add_argument("--set", action="append", help="Hydra override of the recipe (repeatable)")
        sp.add_argument("--devices", type=int, default=None, help="devices (ranks) on this node")
        sp.add_argument(
            "--resource", default=None, help="Ray resource name of a device (NPU, GPU; CPU: none)"
        )
        sp.add_argument("--num-cpus", type=int, default=None)
        sp.add_argument("--temp-dir", default=os.environ.get("ASCEND_R1_RAY_TEMP", DEFAULT_TEMP))
        sp.add_argument("--ray-arg", action="append", help="extra `ray start` flag (repeatable)")

    h = sub.add_parser("head", help="start the head; with --nodes (or a recipe), wait for the cluster")
    common(h)
    h.add_argument("--port", type=int, default=None)
    h.add_argument("--dashboard-port", type=int, default=None)
    h.add_argument("--nodes", type=int, default=0, help="wait for this many nodes (0: do not wait)")
    h.add_argument("--wait-timeout", type=float, default=900)
    h.add_argument("--expect", default="", help="comma-separated hosts that must join (named when missing)")
    h.add_argument(
        "--no-wait", action="store_true", help="start the head and return (wait later with `wait`)"
    )
    h.add_argument("--address-file", help="write the head's ip:port here (for scripts)")
    w = sub.add_parser("worker", help="join a head with bounded retries")
    common(w)
    w.add_argument("--address", required=True, help="head IP:port")
    w.add_argument("--retries", type=int, default=30)
    w.add_argument("--delay", type=float, default=10)
    w.add_argument("--attempt-timeout", type=float, default=120)
    w.add_argument(
        "--hold",
        action="store_true",
        help="after joining, stay until this node's raylet ends (keeps a Slurm step alive)",
    )
    w.add_argument("--rejoin", action="store_true", help="with --hold: join again when the raylet ends")
    wt = sub.add_parser("wait", help="wait for N nodes x M devices")
    common(wt)
    wt.add_argument("--address", required=True)
    wt.add_argument("--nodes", type=int, default=0)
    wt.add_argument("--dashboard-port", type=int, default=None)
    wt.add_argument("--timeout", type=float, default=900)
    wt.add_argument("--expect", default="")
    sub.add_parser("job", help="a recipe's run on the cluster under make train's supervisor", add_help=False)
    s = sub.add_parser(
        "stop", help="end this cluster's Ray processes (its --temp-dir) and check none is left"
    )
    s.add_argument("--temp-dir", default=os.environ.get("ASCEND_R1_RAY_TEMP", DEFAULT_TEMP))
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["job"]:  # listed in --help; tools/launch/__main__.py runs it (tools/cluster/ray_job.py)
        p.error("`cluster job` runs through `python -m tools.launch cluster job` (make ray-job)")
    args = p.parse_args(argv)
    if args.cmd in ("head", "worker", "wait"):
        _apply_recipe(args)
        args.devices = 1 if args.devices is None else args.devices
        args.resource = args.resource or "NPU"
        if getattr(args, "dashboard_port", 0) is None:
            args.dashboard_port = 8265
        if getattr(args, "port", 0) is None:
            args.port = 6766
        os.environ["ASCEND_R1_RAY_DASHBOARD_PORT"] = str(getattr(args, "dashboard_port", 8265))
    if args.cmd == "address":
        ip, source = node_address()
        print(f"{ip or 'auto'}\t{source}")
    elif args.cmd == "head":
        address = start_head(args)
        if args.address_file:
            atomic.write_bytes(Path(args.address_file), (address + "\n").encode())
        if args.nodes and not args.no_wait:
            wait_for(address, args.nodes, args.devices, args.resource, args.wait_timeout, _hosts(args.expect))
    elif args.cmd == "worker":
        start_worker(args)
        while args.hold:
            hold(args.temp_dir)
            if not args.rejoin:
                break
            print("joining again (--rejoin)", flush=True)
            start_worker(args)  # a head gone for good: its bounded retries end this (exit 2)
    elif args.cmd == "wait":
        wait_for(
            args.address, args.nodes or 1, args.devices, args.resource, args.timeout, _hosts(args.expect)
        )
    elif args.cmd == "stop":
        stop(args.temp_dir)
    return 0


if __name__ == "__main__":
    run_cli(main)
