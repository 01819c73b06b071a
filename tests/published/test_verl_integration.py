"""Our parquet and reward functions inside verl 0.6.0 itself: RLHFDataset reads the converted parquet,
and verl's own loader + naive/batch reward managers call tools/reward/verl_reward.py.

Needs the verl tree (`make bootstrap`, or ASCEND_R1_TREE_VERL=<unpacked verl-0.6.0 sdist>).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import upstream_tree
from tools.data import synthetic as syn
from tools.data.convert import Options, convert

pytestmark = [pytest.mark.upstream, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def verl_path():
    tree = str(upstream_tree("verl"))
    sys.path.insert(0, tree)
    yield tree
    sys.path.remove(tree)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(syn.tiny_tokenizer(tmp_path_factory.mktemp("tok")))


def test_rlhf_dataset_reads_converted_parquet(verl_path: str, tok, tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    src = syn.write_json(syn.deepscaler_rows(12), tmp_path / "s.json")
    convert(Options(src=src, dst=tmp_path / "o", progress=False))
    cfg = OmegaConf.create(
        {
            "max_prompt_length": 512,
            "cache_dir": str(tmp_path / "cache"),
            "filter_overlong_prompts_workers": 1,
            "return_raw_chat": True,
        }
    )
    ds = RLHFDataset([str(tmp_path / "o" / "train.parquet")], tok, cfg)
    assert len(ds) == 12
    item = ds[0]
    assert item["data_source"] == "agentica-org/DeepScaleR-Preview-Dataset"
    assert item["reward_model"]["style"] == "rule" and item["reward_model"]["ground_truth"]
    assert item["index"] == item["extra_info"]["index"] == 0
    text = tok.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=False)
    assert item["raw_prompt_ids"] == tok(text, add_special_tokens=False)["input_ids"]


def _batch(tok, responses: list[str], truths: list[str]):
    import torch
    from verl import DataProto

    prompts = [tok("What is it?", add_special_tokens=False)["input_ids"]] * len(responses)
    resp = [tok(r, add_special_tokens=False)["input_ids"] or [tok.pad_token_id] for r in responses]
    P, R = max(map(len, prompts)), max(map(len, resp))
    p_ids = torch.full((len(resp), P), tok.pad_token_id)
    r_ids = torch.full((len(resp), R), tok.pad_token_id)
    mask = torch.zeros((len(resp), P + R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, resp, strict=True)):
        p_ids[i, P - len(p) :] = torch.tensor(p)
        r_ids[i, : len(r)] = torch.tensor(r)
        mask[i, P - len(p) : P + len(r)] = 1
    return DataProto.from_dict(
        tensors={"prompts": p_ids, "responses": r_ids, "attention_mask": mask},
        non_tensors={
            "data_source": np.array(["deepscaler"] * len(resp), dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": t} for t in truths], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(len(resp))], dtype=object),
        },
    ), [len(r) for r in resp]


@pytest.mark.parametrize(("manager", "name"), [("naive", "compute_score"), ("batch", "compute_score_batch")])
def test_reward_managers_call_our_functions(verl_path: str, tok, manager: str, name: str) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import load_reward_manager

    sys.modules.pop("custom_module", None)  # verl caches the loaded file under this name
    cfg = OmegaConf.create(
        {
            "custom_reward_function": {
                "path": str(REPO / "tools/reward/verl_reward.py"),
                "name": name,
                "reward_kwargs": {"workers": 0},
            },
            "reward_model": {"reward_manager": manager},
            "data": {"reward_fn_key": "data_source"},
        }
    )
    rm = load_reward_manager(cfg, tok, num_examine=0)
    responses = [
        "<think>\n2 + 1 = 3\n</think>\n<answer>\\boxed{\\frac{6}{2}}</answer>",
        "<think>\nhmm\n</think>\n<answer>\\boxed{4}</answer>",
        "So the answer is \\boxed{3}.",
        "<think>\nstill going",
    ]
    data, lengths = _batch(tok, responses, ["3"] * 4)
    out = rm(data, return_dict=True)
    scores = [float(out["reward_tensor"][i, n - 1]) for i, n in enumerate(lengths)]
    assert scores == pytest.approx([1.0, 0.33, 0.67, 0.0])
    assert float(out["reward_tensor"].sum()) == pytest.approx(2.0)
    assert list(out["reward_extra_info"]["acc"]) == [1.0, 0.0, 1.0, 0.0]
    # the vote verl computes maj@N from (tools/reward/vote.py): \\frac{6}{2} votes 3, no answer votes ""
    assert list(out["reward_extra_info"]["pred"]) == ["3", "4", "3", ""]
    sys.modules.pop("custom_module", None)
