"""`make plan` prices a fault (tools/plan/fault_cost.py): the checkpoint's size and save time, the
restart time, and Young/Daly's save interval, which minimises saves + work lost; the cluster recipes save
at the interval it gives."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from tools.errors import UserError
from tools.plan import fault_cost as F
from tools.recipes import recipe as R


def test_the_save_interval_is_young_daly_and_minimises_the_loss() -> None:
    launch = OmegaConf.create({"storage_gbps": 10, "mtbf_hours": 24, "startup_s": 600})
    c = F.price(671_000_000_000, 256, 743.0, launch, fail_grace_s=300)
    assert c.checkpoint_bytes == 671_000_000_000 * 14 and c.per_rank_bytes == c.checkpoint_bytes // 256
    assert c.save_s == pytest.approx(939.4, abs=0.1)
    assert c.restart_s == pytest.approx(300 + 600 + c.save_s)
    assert c.save_freq == round(math.sqrt(2 * c.save_s * 24 * 3600) / 743.0) == 17

    # the overhead at the chosen save_freq is no worse than at its neighbours, and far below 1 or 100
    def overhead(freq: int) -> float:
        return c.save_s / (freq * 743.0) + (freq * 743.0 / 2 + c.restart_s) / (24 * 3600)

    assert c.overhead == pytest.approx(overhead(17))
    assert overhead(17) <= min(overhead(16), overhead(18)) and overhead(17) < overhead(1) < overhead(100) * 10


def test_the_mtbf_default_is_per_device_and_bad_inputs_name_their_key() -> None:
    c = F.price(7_000_000_000, 8, 500.0, OmegaConf.create({}), fail_grace_s=30)
    assert not c.mtbf_given and c.mtbf_h == pytest.approx(F.DEFAULT_MTBF_DEVICE_HOURS / 8)
    for key in ("storage_gbps", "mtbf_hours", "startup_s"):
        with pytest.raises(UserError, match=f"launch.{key}"):
            F.price(1, 1, 1.0, OmegaConf.create({key: 0}), fail_grace_s=0)


def test_a_recipe_without_checkpoints_is_told_so() -> None:
    c = F.price(7_000_000_000, 8, 500.0, OmegaConf.create({"mtbf_hours": 24}), fail_grace_s=30)
    assert any("no checkpoint: a failure loses the whole run" in x for x in F.lines(c, -1, None))
    assert not any("the recipe:" in x for x in F.lines(c, c.save_freq, 2))


@pytest.mark.parametrize("name", ["deepseek-v3-671b-a3", "deepseek-v3-671b-a3-async", "qwen2.5-7b-a2"])
def test_every_cluster_recipe_saves_and_prunes(name: str) -> None:
    cfg = R.compose(name)
    assert cfg.verl.trainer.save_freq > 0 and cfg.verl.trainer.max_actor_ckpt_to_keep == 2
    assert cfg.launch.restarts == 3
