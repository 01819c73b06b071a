"""R1-Zero in miniature's base model (tools/miniature/trace_model.py): its settings checked, its tokenizer (one
token a digit and a tag, so the format is the response's first choice), and a short pre-training end to end
into a folder verl and hf-to-mcore can read, with every gate measured and recorded. A few steps here (the
plumbing); whether the real base model meets its gates is tests/test_zero.py's and `make bench-zero`'s job."""

from __future__ import annotations

import json

import pytest

from tools.miniature import assets as A
from tools.miniature import trace_model as TM
from tools.tasks import long_addition as T


def test_settings_refuse_an_unknown_key_and_a_share_without_both_formats():
    with pytest.raises(TM.TraceModelError, match=r"unknown keys \['p_correct'\]") as e:
        TM.Settings.from_mapping({"p_correct": 0.3})
    assert "tools/miniature/trace_model.py Settings" in e.value.fix and "trace_share" in e.value.fix
    for share in (0.0, 1.0):
        with pytest.raises(TM.TraceModelError, match="trace_share"):
            TM.Settings.from_mapping({"trace_share": share})
    assert TM.Settings.from_mapping({"steps": 7, "trace_weight": 2}).steps == 7


def test_each_gate_is_met_at_its_bound_and_missed_beyond_it():
    for gate, at, beyond in (
        ("forced_trace_hardest", 0.85, 0.84),
        ("forced_direct_hardest", 0.35, 0.36),
        ("trace_rate_gap", 0.1, 0.11),
        ("unstopped", 0, 1),
    ):
        assert TM.met(gate, at) and not TM.met(gate, beyond), gate


def test_the_tokenizer_spells_digits_and_tags_one_token_each(tmp_path):
    tok = TM.make_tokenizer(tmp_path, 384, TM.Settings(max_digits=3))
    p = T.Problem(482, 905)
    for text in (T.trace_response(p), T.direct_response(p)):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    for tag in T.TAGS:
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    assert len(tok("48213", add_special_tokens=False)["input_ids"]) == 5
    with pytest.raises(TM.TraceModelError, match="vocab_size"):
        TM.make_tokenizer(tmp_path / "small", 40, TM.Settings(max_digits=3))


def test_a_short_pretraining_writes_a_model_with_every_gate_recorded(tmp_path):
    s = TM.Settings(max_digits=2, steps=6, batch_size=8, micro_batch=4, eval_samples=1, max_new_tokens=24)
    cfg = A.model_config(vocab_size=384, hidden_size=32, intermediate_size=64, moe_intermediate_size=16)
    test = T.problems(10_000, range(1, 3), 2)
    lines: list[str] = []
    result = TM.make(tmp_path, s, cfg, test, lines.append)
    assert {"config.json", "model.safetensors", TM.RESULT, "tokenizer.json"} <= {
        p.name for p in tmp_path.iterdir()
    }
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["DeepseekV3ForCausalLM"] and saved["hidden_size"] == 32
    held = result["held_out"]
    assert set(held["gates"]) == set(TM.GATES) and held["problems"] == 4 and held["hardest_bucket"] == 2
    # each gate's value is the figure it names, and its verdict the bound applied to it (written out here,
    # not by trace_model's own `met`)
    g, hardest = held["gates"], str(held["hardest_bucket"])
    assert g["forced_trace_hardest"]["value"] == held["forced_trace"][hardest]["acc"]
    assert g["forced_direct_hardest"]["value"] == held["forced_direct"][hardest]["acc"]
    assert g["trace_rate_gap"]["value"] == pytest.approx(abs(held["trace_rate"] - s.trace_share), abs=1e-4)
    unstopped = sum(round((1 - b["stopped"]) * b["responses"]) for b in held["sampled"].values())
    assert g["unstopped"]["value"] == unstopped
    verdicts = {
        "forced_trace_hardest": g["forced_trace_hardest"]["value"] >= 0.85,
        "forced_direct_hardest": g["forced_direct_hardest"]["value"] <= 0.35,
        "trace_rate_gap": g["trace_rate_gap"]["value"] <= 0.1,
        "unstopped": g["unstopped"]["value"] == 0,
    }
    assert {k: v["met"] for k, v in g.items()} == verdicts
    assert TM.read_result(tmp_path) == result
    assert lines[-1] == TM.summary(result) and "forced-trace accuracy" in lines[-1]
    # the stamp that decides reuse names the task and the trace model's own version
    stamp = TM.wanted(s, cfg, "d")
    assert (
        stamp["task"] == "long-addition"
        and stamp["version"] == TM.VERSION
        and stamp["settings"]["steps"] == 6
    )
