"""HF (BF16 or FP8) -> Megatron-core `torch_dist` checkpoint, streamed, without building a model.

torch.distributed.checkpoint does the format: a custom `SavePlanner` turns the plan (mcore_plan) into
write items, one per piece, and resolves each piece lazily from the safetensors mmap (dequantising FP8
on the fly); a custom `StorageWriter` writes the pieces into `.distcp` files of at most `file_bytes`
each, one thread per file, each file to `.partial` then renamed, and records finished files so that
a killed run resumes. The reader side is torch's stock `FileSystemReader`, which Megatron uses.

Files written: `__0_<i>.distcp`, `.metadata`, `common.pt`, `metadata.json` (what megatron-core
0.12.1 writes for `torch_dist`), plus `hf-to-mcore.state.json` (resume record; harmless to loaders).
"""

from __future__ import annotations

import io
import json
import pickle
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from tqdm import tqdm

from tools import atomic
from tools.weights.errors import WeightsError
from tools.weights.hf_config import read_config
from tools.weights.mcore_plan import DEFAULT_CHUNK_BYTES, Piece, Plan, check_coverage, plan_checkpoint
from tools.weights.safetensors_index import Checkpoint

STATE_NAME = "hf-to-mcore.state.json"
METADATA_JSON = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}
DEFAULT_FILE_BYTES = 1 << 30


def extra_state_bytes() -> bytes:
    """What Megatron stores for an empty `_extra_state` ShardedObject: torch.save([None])."""
    buf = io.BytesIO()
    torch.save([None], buf)
    return buf.getvalue()


class PlanSavePlanner(SavePlanner):
    """A SavePlanner whose state dict is the plan: write items for every piece and object."""

    def __init__(self, plan: Plan, ckpt: Checkpoint):
        self.plan = plan
        self.ckpt = ckpt
        self.pieces: dict[tuple[str, tuple[int, ...]], Piece] = {}
        self._extra = extra_state_bytes()
        self.resolved: dict[tuple[str, tuple[int, ...] | None], int] = {}
        self._lock = threading.Lock()

    def set_up_planner(self, state_dict=None, storage_meta=None, is_coordinator: bool = True) -> None:
        pass

    def create_local_plan(self) -> SavePlan:
        items = [WriteItem(index=MetadataIndex(k), type=WriteItemType.BYTE_IO) for k in self.plan.objects]
        for t in self.plan.tensors.values():
            props = TensorProperties(dtype=t.dtype)
            for p in t.pieces:
                self.pieces[(t.key, p.offsets)] = p
                items.append(
                    WriteItem(
                        index=MetadataIndex(t.key, torch.Size(p.offsets)),
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(
                            chunk=ChunkStorageMetadata(torch.Size(p.offsets), torch.Size(p.sizes)),
                            properties=props,
                            size=torch.Size(t.shape),
                        ),
                    )
                )
        return SavePlan(items)

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        md: dict = {k: BytesStorageMetadata() for k in self.plan.objects}
        for t in self.plan.tensors.values():
            md[t.key] = TensorStorageMetadata(
                properties=TensorProperties(dtype=t.dtype),
                size=torch.Size(t.shape),
                chunks=[ChunkStorageMetadata(torch.Size(p.offsets), torch.Size(p.sizes)) for p in t.pieces],
            )
        return all_plans, Metadata(state_dict_metadata=md)

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        fqn = write_item.index.fqn
        off = tuple(write_item.index.offset) if write_item.index.offset is not None else None
        with self._lock:
            self.resolved[(fqn, off)] = self.resolved.get((fqn, off), 0) + 1
        if write_item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(self._extra)
        p = self.pieces[(fqn, off)]
        data = self.ckpt.read_rows(p.source, p.row0, p.row1).reshape(p.sizes).contiguous()
        if data.untyped_storage().nbytes() != data.nbytes:
            data = data.clone()  # torch.save writes the whole storage: keep only this chunk's bytes
        return data


def _item_bytes(item: WriteItem) -> int:
    """Bytes of this item's chunk (torch's own helper counts the whole global tensor)."""
    if item.type == WriteItemType.BYTE_IO:
        return 0
    td = item.tensor_data
    n = 1
    for s in td.chunk.sizes:
        n *= s
    return n * td.properties.dtype.itemsize


class CappedFileWriter(StorageWriter):
    """Writes items into `__0_<i>.distcp` files of at most `file_bytes`, one thread per file.

    Each tensor is stored as torch's FileSystemWriter stores it (`torch.save` of the chunk at an
    offset), so torch's FileSystemReader and Megatron read it. Unlike torch's writer, a chunk is freed
    as soon as it is written, and finished files are recorded for resuming.
    """

    def __init__(self, path: Path, file_bytes: int, threads: int, state: dict, progress: tqdm | None):
        super().__init__()
        self.path = Path(path)
        self.file_bytes = file_bytes
        self.threads = max(1, threads)
        self.state = state
        self.progress = progress
        self._state_lock = threading.Lock()
        self.files_written: list[str] = []
        self.files_skipped: list[str] = []

    # protocol -------------------------------------------------------------------------------------
    def reset(self, checkpoint_id=None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True

    def storage_meta(self) -> StorageMeta | None:
        return None

    def buckets(self, items: list[WriteItem]) -> list[list[WriteItem]]:
        """Objects in the first file, then tensors in plan order, a new file when the cap is reached."""
        out: list[list[WriteItem]] = [[i for i in items if i.type == WriteItemType.BYTE_IO]]
        size = 0
        for item in (i for i in items if i.type != WriteItemType.BYTE_IO):
            n = _item_bytes(item)
            if out[-1] and size + n > self.file_bytes:
                out.append([])
                size = 0
            out[-1].append(item)
            size += n
        return [b for b in out if b]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        buckets = self.buckets(plan.items)
        with ThreadPoolExecutor(max_workers=self.threads) as pool:
            futures = [
                pool.submit(self._write_file, f"__0_{i}.distcp", b, planner) for i, b in enumerate(buckets)
            ]
            results = [r for f in futures for r in f.result()]
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def _write_file(self, name: str, items: list[WriteItem], planner: SavePlanner) -> list[WriteResult]:
        done = self.state["done"].get(name)
        if done is not None and (self.path / name).is_file():
            self.files_skipped.append(name)
            if self.progress is not None:
                self.progress.update(sum(_item_bytes(i) for i in items))
            return [
                WriteResult(
                    index=MetadataIndex(fqn, torch.Size(off) if off is not None else None),
                    size_in_bytes=length,
                    storage_data=_StorageInfo(name, offset, length),
                )
                for fqn, off, offset, length in done
            ]
        results: list[WriteResult] = []
        with atomic.atomic_path(self.path / name) as tmp, open(tmp, "wb") as f:
            for item in items:
                data = planner.resolve_data(item)
                offset = f.tell()
                if item.type == WriteItemType.BYTE_IO:
                    f.write(data.getbuffer())
                else:
                    torch.save(data, f)
                length = f.tell() - offset
                results.append(
                    WriteResult(
                        index=item.index,
                        size_in_bytes=length,
                        storage_data=_StorageInfo(name, offset, length),
                    )
                )
                if self.progress is not None:
                    self.progress.update(_item_bytes(item))
                del data
        record = [
            [
                r.index.fqn,
                list(r.index.offset) if r.index.offset is not None else None,
                r.storage_data.offset,
                r.storage_data.length,
            ]
            for r in results
        ]
        with self._state_lock:
            self.state["done"][name] = record
            self.state["done"] = dict(sorted(self.state["done"].items()))  # independent of thread timing
            atomic.write_json(self.path / STATE_NAME, self.state)
            self.files_written.append(name)
        return results

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Write `.metadata` canonically (sorted, fresh objects, shared strings), so that a resumed run
        pickles to the same bytes as an uninterrupted one."""
        keys = {k: k for k in metadata.state_dict_metadata}
        names: dict[str, str] = {}
        storage = {}
        flat = sorted(
            (r for rs in results for r in rs), key=lambda r: (r.index.fqn, tuple(r.index.offset or ()))
        )
        for wr in flat:
            off = wr.index.offset
            index = MetadataIndex(
                keys[wr.index.fqn], torch.Size(tuple(int(x) for x in off)) if off is not None else None
            )
            info = wr.storage_data
            path = names.setdefault(info.relative_path, str(info.relative_path))
            storage[index] = _StorageInfo(path, int(info.offset), int(info.length))
        metadata.storage_data = storage
        metadata.storage_meta = None
        atomic.write_bytes(self.path / ".metadata", pickle.dumps(metadata))


@dataclass
class McoreReport:
    tensors: int = 0
    objects: int = 0
    params: int = 0
    bytes: int = 0
    files: int = 0
    files_skipped: int = 0
    skipped: list[str] = field(default_factory=list)


def convert_hf_to_mcore(
    src_dir: Path,
    dst_dir: Path,
    threads: int = 2,
    file_bytes: int = DEFAULT_FILE_BYTES,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: bool = True,
    plan_hook=None,
    layer_spec: str = "te",
) -> McoreReport:
    """Convert; `plan_hook(plan)` may edit the plan before the coverage check (tests use it).
    `layer_spec` names the keys for megatron-core's TE ("te") or local ("local") layer spec."""
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    cfg = read_config(src_dir)
    ckpt = Checkpoint(src_dir)
    plan = plan_checkpoint(cfg, ckpt, chunk_bytes, layer_spec)
    if plan_hook is not None:
        plan_hook(plan)
        check_coverage(plan)

    dst_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = {f: (ckpt.root / f).stat().st_size for f in ckpt.files}
    state = {
        "source_files": fingerprint,
        "file_bytes": file_bytes,
        "chunk_bytes": chunk_bytes,
        "layer_spec": layer_spec,
        "done": {},
    }
    state_path = dst_dir / STATE_NAME
    if state_path.is_file():
        old = json.loads(state_path.read_text())
        keys = ("source_files", "file_bytes", "chunk_bytes", "layer_spec")
        if {k: old.get(k, "te" if k == "layer_spec" else None) for k in keys} != {k: state[k] for k in keys}:
            raise WeightsError(
                f"{state_path}: an earlier run wrote {dst_dir} from another source or with other "
                "--file-mb/--chunk-mb/--layer-spec; use an empty output directory (or delete this one yourself)"
            )
        state["done"] = old["done"]
    elif any(dst_dir.iterdir()):
        raise WeightsError(f"{dst_dir}: not empty and not a conversion in progress; use an empty directory")
    atomic.write_json(state_path, state)

    total = sum(p.numel * t.dtype.itemsize for t in plan.tensors.values() for p in t.pieces)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="hf->mcore", disable=not progress)
    planner = PlanSavePlanner(plan, ckpt)
    writer = CappedFileWriter(dst_dir, file_bytes, threads, state, bar)
    planner.set_up_planner({}, None, True)
    writer.set_up_storage_writer(True)
    local = writer.prepare_local_plan(planner.create_local_plan())
    plans, metadata = planner.create_global_plan([local])
    final = planner.finish_plan(writer.prepare_global_plan(plans)[0])
    results = writer.write_data(final, planner).result()
    bar.close()
    _check_written_once(final, results)
    writer.finish(metadata, [results])
    buf = io.BytesIO()
    torch.save({}, buf)
    atomic.write_bytes(dst_dir / "common.pt", buf.getvalue())
    atomic.write_json(dst_dir / "metadata.json", METADATA_JSON)  # last: marks a complete checkpoint
    return McoreReport(
        tensors=len(plan.tensors),
        objects=len(plan.objects),
        params=plan.params,
        bytes=total,
        files=len(writer.files_written) + len(writer.files_skipped),
        files_skipped=len(writer.files_skipped),
        skipped=plan.skipped,
    )


def _check_written_once(plan: SavePlan, results: list[WriteResult]) -> None:
    want = {(i.index.fqn, tuple(i.index.offset) if i.index.offset is not None else None) for i in plan.items}
    got: dict = {}
    for r in results:
        k = (r.index.fqn, tuple(r.index.offset) if r.index.offset is not None else None)
        got[k] = got.get(k, 0) + 1
    twice = [k for k, n in got.items() if n > 1]
    lost = want - set(got)
    if twice or lost or set(got) - want:
        raise WeightsError(
            f"internal error: chunks written twice {twice[:3]}, not written {sorted(lost)[:3]}; "
            "the output is incomplete: report this bug"
        )
