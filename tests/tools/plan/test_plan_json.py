"""`make plan ... JSON=1`: one JSON object with the documented keys (docs/launch.md)."""

from __future__ import annotations

import json

from tools.launch.__main__ import main as cli_main

KEYS = {
    "memory",
    "time_s",
    "step_s",
    "tokens_per_s_per_device",
    "tokens_per_s_per_card",
    "time_accuracy",
    "fits",
    "rules",
}


def test_json_prints_one_object_with_the_interface_keys(capsys):
    assert cli_main(["plan", "deepseek-v3-671b-a3", "--no-env", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # the whole output is one object
    assert set(out) >= KEYS and out["fits"] is True and out["ok"] is True
    assert isinstance(out["time_s"], dict)  # the time model's slot (empty without it)
    for r in out["rules"]:
        assert set(r) >= {"status", "name", "message"} and r["status"] in {
            "PASS",
            "WARN",
            "FAIL",
            "SKIP",
            "INFO",
        }
    actor = next(v for k, v in out["memory"].items() if k.startswith("actor update"))
    assert actor["components"]["actor weights (bf16)"] > 0 and actor["peak_gib"] >= actor["resident_gib"]
    assert {"resident_gib", "peak_gib", "peak_moment", "capacity_gib", "transients"} <= set(actor)


def test_json_before_an_override_and_a_bad_value_still_one_object(capsys):
    """`--json` last on make's line, or followed by an override; a bad value is a FAIL record."""
    assert cli_main(["plan", "tiny-cpu", "--no-env", "--json", "verl.data.train_batch_size=abc"]) == 1
    out = json.loads(capsys.readouterr().out)
    fails = [r for r in out["rules"] if r["status"] == "FAIL"]
    assert [r["name"] for r in fails] == ["verl.data.train_batch_size is a whole number >= 1"]
    assert out["fits"] is False and out["memory"] == {}
