"""The hardware groups the planner times a step on: per-rank figures of each chip, each with its source.

A rank is what torch sees as one device: an A3 NPU package (Ascend 910C) carries two dies and torch_npu
shows each die as its own device, so every A3 figure here is per die (half the package's); an A2 NPU
(Ascend 910B) is one die. Links are per rank and per direction. The scale-up domain is the set of ranks
that reach each other over the fast fabric (HCCS/UB on Ascend, NVLink on NVIDIA); traffic leaving it goes
over RoCE/InfiniBand.

What the planner reads, by recipe (`launch.hardware`): a3-* -> A3, a2-* -> A2, cpu -> CPU (this
machine). The GPU groups (h100-*, h20-*) exist to check the model against published GPU runs
(docs/plan-time.md); no recipe of this distribution targets them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.errors import UserError

GB = 1e9
TB = 1e12

CLOUDMATRIX = "https://arxiv.org/abs/2506.12708 (Serving LLMs on Huawei CloudMatrix384, sec. 3)"
CLOUDMATRIX_SUMMARY = "https://www.emergentmind.com/topics/cloudmatrix-datacenter-architecture"
TECHPOWERUP_910C = (
    "https://techpowerup.com/335749/huawei-prepares-6-nm-ascend-920c-accelerator-900-teraflops-4000-gb-s-hbm3"
)
SGL_KERNEL_NPU = "https://github.com/sgl-project/sgl-kernel-npu (README: DeepEP-style dispatch/combine on A3)"
GITEE_910B = (
    "https://ai.gitee.com/docs/compute/clusters_gpu/ascend_gpu (910B: FP16/BF16 280 TFLOPS, INT8 560)"
)
ASCEND_910_INT8 = (
    "https://www.besthub.dev/articles/how-huawei-ascend-910-redefines-ai-training-performance-d95c7f11f1dc "
    "(Ascend 910: 256 TFLOPS FP16 / 512 TOPS INT8): the cube unit doubles its rate in INT8"
)
A2_PRODUCT = (
    "https://e.huawei.com/cn/products/computing/ascend/atlas-800t-a2 (Atlas 800T A2: 8 x 910B, HCCS full "
    "mesh 7 x 56 GB/s, 8 x 200GE RoCE; the product page as commonly quoted, not retrieved by this project)"
)
AIWIKI_910C = "https://aiwiki.ai/wiki/huawei_ascend_910c (910C = two 910B-class dies, 128 GB, 3.2 TB/s)"
HICCS_HIAM = (
    "https://www.hiascend.com/document/detail/en/mindcluster/730/clustersched/schedulingug/"
    "dl_affinity_0040.html (A3 node: 8 modules of 2 dies; modules joined by HCCS)"
)
H100 = "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 989 TFLOPS dense BF16, 3.35 TB/s, NVLink 900 GB/s)"
H20 = "https://willitrunai.com/es/gpus/h20-96gb (H20: 148 TFLOPS FP16/BF16, 96 GB HBM3 4.0 TB/s, NVLink 900 GB/s)"
PCIE5 = (
    "https://en.wikipedia.org/wiki/PCI_Express (5.0 x16: 32 GT/s x 16 lanes, 128b/130b = 63 GB/s a direction)"
)
JISHUZHAN_910B = (
    "https://jishuzhan.net/article/1872432607539499010 (910B: card to host PCIe 4.0 x16, 31.5 GB/s)"
)


@dataclass(frozen=True)
class Figure:
    value: float
    source: str


@dataclass(frozen=True)
class Chip:
    """Per-rank peak figures. bytes and bytes/s; FLOP/s."""

    name: str
    bf16_flops: Figure
    int8_ops: Figure
    hbm_bytes: Figure
    hbm_bw: Figure
    scaleup_bw: Figure  # per rank, per direction, inside the scale-up domain
    scaleout_bw: Figure  # per rank, per direction, between scale-up domains
    host_bw: Figure  # device <-> host memory, per rank, per direction
    scaleup_ranks: int  # ranks in one scale-up domain
    ep_alltoall_bw: Figure | None = None  # a measured MoE dispatch/combine bandwidth, when published
    # the software stack whose launch and collective latencies the step-time model's fixed-cost factors
    # carry (torch_npu + CANN + HCCL on Ascend): factors fitted on one stack are not applied to another
    stack: str = "ascend"

    def figures(self) -> dict[str, Figure]:
        out = {
            "bf16 peak (FLOP/s)": self.bf16_flops,
            "int8 peak (OP/s)": self.int8_ops,
            "HBM (bytes)": self.hbm_bytes,
            "HBM bandwidth (B/s)": self.hbm_bw,
            "scale-up link (B/s)": self.scaleup_bw,
            "scale-out link (B/s)": self.scaleout_bw,
            "host link (B/s)": self.host_bw,
        }
        if self.ep_alltoall_bw:
            out["MoE all-to-all, measured (B/s)"] = self.ep_alltoall_bw
        return out


A3 = Chip(
    name="Ascend 910C die (Atlas 800T A3 / Atlas 900 A3 SuperPoD)",
    bf16_flops=Figure(
        376 * TB, f"{CLOUDMATRIX}: 752 TFLOPS dense BF16 a package of 2 dies; {TECHPOWERUP_910C}"
    ),
    int8_ops=Figure(
        752 * TB,
        f"ASSUMPTION, no published 910C figure: 2 x BF16, as the 910 and 910B are quoted: {ASCEND_910_INT8}; "
        f"{GITEE_910B}",
    ),
    hbm_bytes=Figure(64 * GB, f"{CLOUDMATRIX}: 128 GB a package; {AIWIKI_910C}"),
    hbm_bw=Figure(1.6 * TB, f"{CLOUDMATRIX}: 3.2 TB/s a package; {TECHPOWERUP_910C}"),
    scaleup_bw=Figure(196 * GB, f"{CLOUDMATRIX}: UB plane, 7 x 224 Gbit/s a die; {CLOUDMATRIX_SUMMARY}"),
    scaleout_bw=Figure(25 * GB, f"{CLOUDMATRIX}: RDMA plane, 200 Gbit/s a die"),
    host_bw=Figure(
        40 * GB,
        f"DERIVED, a ceiling, not a measured copy rate: {CLOUDMATRIX_SUMMARY}: 4 Kunpeng CPUs a node of 8 "
        "packages, ~160 GB/s UB each = 40 GB/s a die",
    ),
    # CloudMatrix384 / Atlas 900 A3 SuperPoD: 384 packages on one UB fabric. ASSUMPTION for the seed run's
    # "128 Atlas 800T A3": no source says its 16 nodes shared one UB fabric (docs/plan-time.md)
    scaleup_ranks=768,
    ep_alltoall_bw=Figure(
        87 * GB, f"{SGL_KERNEL_NPU}: dispatch 87 GB/s, combine 121 GB/s at EP16 inter-node"
    ),
)

A2 = Chip(
    name="Ascend 910B (Atlas 800T A2)",
    bf16_flops=Figure(280 * TB, f"{GITEE_910B}; the 910B variant (B1-B4, different peaks) is not stated"),
    int8_ops=Figure(560 * TB, GITEE_910B),
    hbm_bytes=Figure(64 * GB, f"{GITEE_910B}: 64 GB HBM2e"),
    hbm_bw=Figure(
        1.6 * TB,
        f"ASSUMPTION, no 910B figure found: one 910B-class die of the 910C: {CLOUDMATRIX} (1.6 TB/s a die); "
        f"{AIWIKI_910C}",
    ),
    scaleup_bw=Figure(56 * GB, f"{A2_PRODUCT}: one HCCS link to each of the 7 peers"),
    scaleout_bw=Figure(25 * GB, f"{A2_PRODUCT}: 200GE a NPU"),
    host_bw=Figure(31.5 * GB, JISHUZHAN_910B),
    scaleup_ranks=8,
)

H100_SXM = Chip(
    name="NVIDIA H100 SXM (validation only)",
    bf16_flops=Figure(989 * TB, H100),
    int8_ops=Figure(1979 * TB, H100),
    hbm_bytes=Figure(80 * GB, H100),
    hbm_bw=Figure(3.35 * TB, H100),
    scaleup_bw=Figure(450 * GB, H100),
    scaleout_bw=Figure(50 * GB, "ConnectX-7 400 Gbit/s a GPU (DGX H100)"),
    host_bw=Figure(63 * GB, PCIE5),
    scaleup_ranks=8,
    stack="cuda",
)

H20_GPU = Chip(
    name="NVIDIA H20 (validation only)",
    bf16_flops=Figure(148 * TB, H20),
    int8_ops=Figure(296 * TB, H20),
    hbm_bytes=Figure(96 * GB, H20),
    hbm_bw=Figure(4.0 * TB, H20),
    scaleup_bw=Figure(450 * GB, H20),
    scaleout_bw=Figure(50 * GB, "400 Gbit/s a GPU, as the H100 systems"),
    host_bw=Figure(63 * GB, PCIE5),
    scaleup_ranks=8,
    stack="cuda",
)

# This machine (the CPU group): 2 cores, AVX-512 with avx512_bf16, no AMX; measured 2026-11-26 with the
# machine shared by other jobs, by bench/plan_cpu_figures.py (bf16 2048x2048 matmul, best of 5; a 256 MiB
# tensor copy, read + write)
CPU_MEASURED = "measured here by bench/plan_cpu_figures.py (2 cores, avx512_bf16, no AMX)"
CPU = Chip(
    name="this machine's CPU (one gloo rank)",
    bf16_flops=Figure(209.9e9, f"{CPU_MEASURED}: bf16 matmul 209.9 GFLOP/s"),
    int8_ops=Figure(209.9e9, f"{CPU_MEASURED}: no int8 path measured; the bf16 rate"),
    hbm_bytes=Figure(4 * 2**30, "recipes/hardware/cpu.yaml: device_memory_gib 4"),
    hbm_bw=Figure(11.7e9, f"{CPU_MEASURED}: memory copy 11.7 GB/s"),
    scaleup_bw=Figure(11.7e9, f"{CPU_MEASURED}: gloo over loopback is a memory copy"),
    scaleout_bw=Figure(11.7e9, f"{CPU_MEASURED}: one node"),
    host_bw=Figure(11.7e9, f"{CPU_MEASURED}: the device is the host"),
    scaleup_ranks=1 << 20,
    stack="cpu",
)

CHIPS = {"a3": A3, "a2": A2, "cpu": CPU, "h100": H100_SXM, "h20": H20_GPU}


def chip_for(hardware: str) -> Chip:
    """The chip of a recipe's launch.hardware (a3-16x16 -> A3, a2-8 -> A2, cpu -> CPU)."""
    family = hardware.split("-", 1)[0].lower()
    if family not in CHIPS:
        raise UserError(
            f"launch.hardware = {hardware!r}: no step-time figures for this hardware",
            fix=f"name a hardware group starting with one of {', '.join(CHIPS)} (recipes/hardware/)",
        )
    return CHIPS[family]


@dataclass(frozen=True)
class Group:
    """A hardware group: the chip and how many of its ranks a recipe has."""

    key: str
    chip: Chip
    nodes: int
    ranks_per_node: int
    dies_per_device: int

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    def link_bw(self, span: int, *, alltoall: bool = False) -> tuple[float, str]:
        """Per-rank bandwidth of a collective over `span` consecutive ranks, and which link it uses."""
        if alltoall and self.chip.ep_alltoall_bw is not None and span > 1:
            return self.chip.ep_alltoall_bw.value, "MoE all-to-all (measured)"
        if span <= min(self.chip.scaleup_ranks, self.world):
            return self.chip.scaleup_bw.value, "scale-up"
        return self.chip.scaleout_bw.value, "scale-out"
