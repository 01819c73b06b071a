"""A typo in an override key: Hydra's "Could not override", plus the nearest key of the composed recipe."""

from __future__ import annotations

import pytest

from tools.recipes.recipe import RecipeError, compose


@pytest.mark.parametrize(
    ("override", "nearest"),
    [
        ("verl.data.train_batch_sise=8", "verl.data.train_batch_size"),
        ("launch.step=8", "launch.steps"),
        ("verl.dta.train_batch_size=8", "verl.data.train_batch_size"),
    ],
)
def test_a_misspelt_key_names_the_nearest_existing_one(override: str, nearest: str) -> None:
    with pytest.raises(RecipeError) as e:
        compose("tiny-cpu", [override])
    text = str(e.value)
    assert f"Could not override '{override.split('=')[0]}'" in text
    assert f"the nearest existing key: {nearest}\n" in text
    assert f"fix: did you mean {nearest}?" in text
