"""The preflight planner: the published 671B configuration passes (one known warning), each kind of broken
configuration fails naming the rule, the values and the fix, and the memory estimate matches a hand
computation for the 671B layout."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import STACK
from tools import stacks
from tools.data.benchmarks import write_benchmarks
from tools.data.schema import SCHEMA
from tools.launch import plan as P
from tools.launch.__main__ import main as cli_main
from tools.launch.plan import memory as M
from tools.launch.recipe import compose

FLAGSHIP = "deepseek-v3-671b-a3"
GIB = 1024**3


@pytest.fixture(autouse=True)
def published_stack_unless_every_stack(request, monkeypatch):
    """The planner's rules as the published run meets them (VLLM_DP_SIZE, verl 0.6.0's token budget, the
    hand-computed memory of its layout): these tests plan on the published stack from either stack's
    session; `every_stack` tests plan on the session's own stack."""
    if request.node.get_closest_marker("every_stack"):
        return
    from tools.patches.config import tree_of

    if not (tree_of("verl", "published") / "verl").is_dir():
        pytest.skip(
            "the published stack is not bootstrapped in this checkout (make bootstrap STACK=published)"
        )
    monkeypatch.setenv("ASCEND_R1_STACK", "published")


def _rows(n: int) -> list[dict]:
    return [
        {
            "data_source": "deepscaler",
            "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"split": "train", "index": i, "source_row": i},
        }
        for i in range(n)
    ]


@pytest.fixture
def prepared(tmp_path, monkeypatch) -> Path:
    """What `make prepare` leaves for the 671B recipe, in miniature: fixed config.json, a shard, tokenizer,
    a torch_dist checkpoint's .metadata, train/test parquet in verl's schema, the benchmarks' parquet."""
    root = tmp_path / "ascend-r1"
    hf = root / "DeepSeek-V3-bf16"
    hf.mkdir(parents=True)
    conf = dict(compose(FLAGSHIP).launch.model_config)
    conf["architectures"] = ["DeepseekV3ForCausalLM"]
    (hf / "config.json").write_text(json.dumps(conf))
    (hf / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 8)
    (hf / "tokenizer.json").write_text("{}")
    (root / "DeepSeek-V3-mcore").mkdir()
    (root / "DeepSeek-V3-mcore" / ".metadata").write_bytes(b"x")
    data = root / "data" / "deepscaler"
    data.mkdir(parents=True)
    for name, n in (("train", 6), ("test", 2)):
        pq.write_table(pa.Table.from_pylist(_rows(n), schema=SCHEMA), data / f"{name}.parquet")
    write_benchmarks(root / "data" / "benchmarks")  # the validation set (verl.data.val_files)
    monkeypatch.setenv("ASCEND_R1_DATA", str(root))
    return root


def statuses(p: P.Plan) -> dict[str, str]:
    return {r.rule: r.status for r in p.results}


@pytest.mark.every_stack  # the flagship as each stack's verl runs it
def test_the_published_configuration_passes_with_its_known_quirk_as_a_warning(prepared):
    p = P.plan(FLAGSHIP)
    st = statuses(p)
    assert p.ok, P.render(p)
    warns = [r.rule for r in p.results if r.status == P.WARN]
    assert warns == ["Megatron seq_length >= prompt + response"], P.render(p)
    w = p.by_rule("Megatron seq_length >= prompt + response")
    assert "seq_length 2048" in w.values and "= 3072" in w.values and "3072" in w.message
    for rule in (
        "data present, verl's schema",
        "HF weights, format",
        "actor Megatron checkpoint",
        "ref Megatron checkpoint",
        "pipeline layers sum to the layer count",
        "on-policy (single mini-batch)",
        "verl accepts every key",
        "rollout EP divides the experts",
        *(
            ["rollout TP x VLLM_DP_SIZE = world"]
            if STACK == "published"
            else [
                "rollout replica TP x DP x PP divides world",
                "rollout EP = TP x DP (or 1)",
                "no VLLM_DP_SIZE with server-mode rollout",
            ]
        ),
    ):
        assert st[rule] == P.PASS, (rule, P.render(p))
    assert p.by_rule("rollout EP divides the experts").values == "256 experts / EP256"
    assert p.by_rule("pipeline layers sum to the layer count").values.startswith(
        "[6, 8, 8, 8, 8, 8, 8, 7] = 61"
    )
    # this machine has no NPU: the NPU-side checks are skipped with the reason, never passed
    assert st["versions"] == P.SKIP and "run `make plan` on a node" in p.by_rule("versions").message
    for phase in (
        "actor update (stage 7)",
        "reference / old log-prob",
        "rollout (generation)",
        "KV cache holds max_num_seqs x max_model_len",
    ):
        assert st[phase] == P.PASS, (phase, P.render(p))
    deviations = [r for r in p.results if r.rule == "deviation from the published run"]
    if STACK == "published":  # verl 0.6.0 and the ascend scheduler force 3072; current keeps 1024
        assert len(deviations) == 1 and "max_num_batched_tokens" in deviations[0].values
    else:
        assert (
            deviations == []
            and compose(FLAGSHIP).verl.actor_rollout_ref.rollout.max_num_batched_tokens == 1024
        )


@pytest.mark.every_stack
def test_server_mode_rollout_rules(prepared):
    """The current stack's rollout: a replica of TP x DP ranks whose experts vLLM spreads itself; the
    published stack's VLLM_DP_SIZE does nothing there and is flagged."""
    if STACK != "current":
        pytest.skip("server-mode rollout is the current stack's (verl 0.9.1)")
    ro = "verl.actor_rollout_ref.rollout."
    p = P.plan(FLAGSHIP, [f"{ro}data_parallel_size=96"])
    assert p.by_rule("rollout replica TP x DP x PP divides world").status == P.FAIL
    p = P.plan(FLAGSHIP, [f"{ro}expert_parallel_size=64"])
    r = p.by_rule("rollout EP = TP x DP (or 1)")
    assert r.status == P.FAIL and "set rollout.expert_parallel_size=256" in r.message
    p = P.plan(FLAGSHIP, ["+launch.env.VLLM_DP_SIZE=128"])
    r = p.by_rule("no VLLM_DP_SIZE with server-mode rollout")
    assert r.status == P.WARN and "rollout.data_parallel_size" in r.message
    p = P.plan(FLAGSHIP, [f"{ro}enable_chunked_prefill=false"])
    assert p.by_rule("max_num_batched_tokens >= max_model_len").status == P.FAIL


def test_missing_or_wrong_inputs_fail_with_the_make_target_that_fixes_them(prepared):
    (prepared / "DeepSeek-V3-mcore" / ".metadata").unlink()
    conf = json.loads((prepared / "DeepSeek-V3-bf16" / "config.json").read_text())
    conf["quantization_config"] = {"quant_method": "fp8"}
    (prepared / "DeepSeek-V3-bf16" / "config.json").write_text(json.dumps(conf))
    (prepared / "data" / "benchmarks" / "aime24.parquet").unlink()
    p = P.plan(FLAGSHIP)
    assert not p.ok
    ck = p.by_rule("actor Megatron checkpoint")
    assert ck.status == P.FAIL and "make convert-mcore" in ck.message
    hf = p.by_rule("HF weights, format")
    assert hf.status == P.FAIL and "quantization_config" in hf.message and "make fix-config" in hf.message
    data = p.by_rule("data present")
    assert (
        data.status == P.FAIL
        and "benchmarks/aime24.parquet" in data.values
        and f"make prepare RECIPE={FLAGSHIP}" in data.message
        and f"make benchmarks DST={prepared / 'data' / 'benchmarks'}" in data.message
    )


BROKEN = [
    # (overrides, rule, status, words in values, words in the fix)
    (
        ["launch.env.VLLM_DP_SIZE=64"],
        "rollout TP x VLLM_DP_SIZE = world",
        P.FAIL,
        ["TP2 x VLLM_DP_SIZE 64 = 128", "world 256"],
        ["VLLM_DP_SIZE=128", "silently shrinks"],
    ),
    (
        ["verl.actor_rollout_ref.actor.megatron.expert_model_parallel_size=48"],
        "actor EP divides the experts",
        P.FAIL,
        ["256 experts / EP48"],
        ["must divide 256"],
    ),
    (
        ["verl.actor_rollout_ref.actor.megatron.expert_model_parallel_size=64"],
        "ETP x EP x PP divides world",
        P.FAIL,
        ["ETP1 x EP64 x PP8 = 512", "world 256"],
        ["lower EP"],
    ),
    (
        [
            "verl.actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=5"
        ],
        "pipeline layers sum to the layer count",
        P.FAIL,
        ["None", "first 5, last 7"],
        ["6 middle stages"],
    ),
    (
        ["launch.nodes=15"],
        "prompts split over rollout engines",
        P.FAIL,
        ["512 prompts / 120 engines"],
        ["multiple of world / rollout TP = 120"],
    ),
    (
        ["launch.nodes=15"],
        "ETP x EP x PP divides world",
        P.FAIL,
        ["= 256, world 240"],
        ["world % (ETP*EP*PP)"],
    ),
    (
        ["verl.actor_rollout_ref.actor.ppo_mini_batch_size=384"],
        "mini-batch divides the batch",
        P.FAIL,
        ["512 prompts / mini 384"],
        ["multiple of actor.ppo_mini_batch_size"],
    ),
    (
        ["verl.actor_rollout_ref.actor.ppo_mini_batch_size=256"],
        "on-policy (single mini-batch)",
        P.FAIL,
        ["2 mini-batch(es)"],
        ["ppo_mini_batch_size = train_batch_size"],
    ),
    (
        ["verl.actor_rollout_ref.actor.ppo_epochs=2"],
        "on-policy (single mini-batch)",
        P.FAIL,
        ["ppo_epochs 2"],
        ["ppo_epochs=1"],
    ),
    (
        ["verl.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
        "micro-batch divides the rank's mini-batch",
        P.FAIL,
        ["256 / micro 3"],
        ["must divide"],
    ),
    (
        [
            "verl.data.train_batch_size=100",
            "verl.actor_rollout_ref.actor.ppo_mini_batch_size=100",
            "verl.actor_rollout_ref.rollout.n=4",
        ],
        "mini-batch x n divides over DP",
        P.FAIL,
        ["100 x 4 / DP32 = 12.5"],
        ["multiple of the actor's DP size 32"],
    ),
    (
        ["verl.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3"],
        "rollout log-prob micro-batch divides",
        P.FAIL,
        ["256 a rank, micro 3"],
        ["log_prob_micro_batch_size_per_gpu must divide"],
    ),
    (
        ["verl.actor_rollout_ref.rollout.max_num_seqs=32"],
        "max_num_seqs covers an engine's sequences",
        P.WARN,
        ["max_num_seqs 32", "= 64 a engine"],
        ["2 waves"],
    ),
    (
        ["verl.actor_rollout_ref.rollout.max_num_batched_tokens=1024"],
        "max_num_batched_tokens >= max_model_len",
        P.FAIL,
        ["max_num_batched_tokens 1024, max_model_len 3072"],
        ["vllm_rollout_spmd.py", "ascend scheduler"],
    ),
    (
        ["verl.actor_rollout_ref.rollout.tensor_model_parallel_size=3"],
        "rollout TP divides world",
        P.FAIL,
        ["TP3, world 256"],
        ["must divide"],
    ),
    (
        ["+verl.actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layerz=8"],
        "transformer overrides known",
        P.FAIL,
        ["unknown: ['recompute_num_layerz']"],
        ["fix the spelling"],
    ),
    (
        ["verl.actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=4"],
        "reference uses the actor's layout",
        P.WARN,
        ["ref TP1 PP4"],
        ["equal to actor.megatron's"],
    ),
    # no offload and the optimizer states on the device: the rollout no longer fits
    (
        [
            "verl.actor_rollout_ref.actor.megatron.param_offload=false",
            "verl.actor_rollout_ref.actor.megatron.grad_offload=false",
            "verl.actor_rollout_ref.actor.megatron.override_transformer_config.swap_optimizer=false",
        ],
        "rollout (generation)",
        P.FAIL,
        ["of 64 GiB"],
        ["over capacity", "offload"],
    ),
    (
        ["verl.actor_rollout_ref.rollout.gpu_memory_utilization=0.3"],
        "KV cache holds max_num_seqs x max_model_len",
        P.FAIL,
        ["pool leaves -"],
        ["no room for any KV cache"],
    ),
]


@pytest.mark.parametrize(
    "overrides,rule,status,values,fix", BROKEN, ids=[f"{b[1]}:{b[0][0]}" for b in BROKEN]
)
def test_each_kind_of_broken_configuration_is_caught(overrides, rule, status, values, fix):
    p = P.plan(FLAGSHIP, overrides, check_machine=False)
    r = p.by_rule(rule)
    assert r.status == status, P.render(p)
    for w in values:
        assert w in r.values, (w, r.values)
    for w in fix:
        assert w in r.message, (w, r.message)
    assert p.ok == (not any(x.status == P.FAIL for x in p.results))
    if status == P.FAIL:
        assert not p.ok


def test_a_world_too_small_for_the_actor_fails_the_layout_without_crashing():
    p = P.plan("qwen2.5-7b-a2", ["hardware=cpu"], check_machine=False)
    assert p.by_rule("actor TP x PP x CP divides world").status == P.FAIL
    assert p.by_rule("per-rank batch rules").status == P.SKIP and not p.ok


def test_no_memory_estimate_for_an_impossible_layout():
    p = P.plan(
        FLAGSHIP, ["verl.actor_rollout_ref.actor.megatron.expert_model_parallel_size=48"], check_machine=False
    )
    r = p.by_rule("device memory")
    assert r.status == P.SKIP and "actor EP divides the experts" in r.message and p.estimate is None


def test_a_verl_key_typo_fails_the_plan():
    p = P.plan(FLAGSHIP, ["+verl.actor_rollout_ref.actor.kl_loss_coeff=0.1"], check_machine=False)
    r = p.by_rule("verl accepts every key")
    assert r.status == P.FAIL and "kl_loss_coeff" in r.message


def test_the_671b_memory_estimate_equals_the_hand_computation():
    p = P.plan(FLAGSHIP, check_machine=False)
    est = p.estimate
    # --- DeepSeek-V3 parameters (HF config numbers) ---
    h, vocab, heads = 7168, 129280, 128
    attn = (
        h * 1536
        + 1536  # q_a_proj + q_a_layernorm
        + 1536 * heads * (128 + 64)  # q_b_proj
        + h * (512 + 64)
        + 512  # kv_a_proj_with_mqa + kv_a_layernorm
        + 512 * heads * (128 + 128)  # kv_b_proj
        + heads * 128 * h  # o_proj
    )
    norms = 2 * h
    router = 256 * h + 256  # gate + e_score_correction_bias
    expert = 3 * h * 2048  # gate, up, down of one expert (moe_intermediate_size 2048)
    dense_mlp = 3 * h * 18432
    embed = vocab * h
    total = (
        embed
        + embed
        + h
        + 3 * (attn + norms + dense_mlp)
        + 58 * (attn + norms + router + expert + 256 * expert)
    )
    assert M.total_params(M.Arch.from_config(dict(compose(FLAGSHIP).launch.model_config))) == total
    assert total == 671_026_419_200  # "671B"
    # --- actor: stage 7 holds layers 54..60 (7 MoE layers), the final norm and the output layer; EP32 ->
    # 8 of 256 experts a rank; TP1 -> everything else whole ---
    stage7 = 7 * (attn + norms + router + expert + 8 * expert) + h + embed
    assert stage7 == 5_023_916_800
    assert [s.total for s in est.stage_params][7] == stage7
    seq = 1024 + 2048
    checkpoints = 7 * 1 * seq * 1 * h * 2  # full block recompute: 7 layer inputs, 1 micro-batch in flight
    working = 34 * seq * h + seq * 8 * (2 * 2048 + h) * 2  # one layer's working set + the MoE part (top-8)
    logits = seq * vocab * 4  # fp32, TP1
    actor = (
        stage7 * 2 + stage7 * 4 + 0 + checkpoints + working + logits
    )  # bf16 weights, fp32 grads, swap optimizer
    assert actor == 33_342_706_176  # 31.05 GiB
    assert est.phases[0].name == "actor update (stage 7)" and est.phases[0].total == actor
    # --- rollout: vLLM TP2, experts over EP = 128 x 2 = 256 ranks -> 1 expert a rank a layer; MLA down-
    # projections, norms and the router replicated; q_b, kv_b, o, shared expert, MLP, embeddings / 2 ---
    tp_part_attn = 1536 * heads * 192 + 512 * heads * 256 + heads * 128 * h
    repl_attn = h * 1536 + 1536 + h * 576 + 512
    moe_layer = (tp_part_attn + expert) // 2 + repl_attn + norms + router + expert
    dense_layer = (tp_part_attn + dense_mlp) // 2 + repl_attn + norms
    rollout_w = 2 * (58 * moe_layer + 3 * dense_layer + 2 * embed // 2 + h)
    assert rollout_w == 23_257_230_336 and est.rollout_weights == rollout_w
    kv_needed = 64 * 3072 * (512 + 64) * 2 * 61  # max_num_seqs x max_model_len x MLA latent bytes x layers
    assert est.kv_needed == kv_needed == 13_816_037_376
    derived = 61 * 512 * heads * 256 // 2 * 2  # W_UK_T/W_UV: a bf16 kv_b_proj copy per layer per TP rank
    act = 3072 * (h * 2 * 16 + vocab * 4 // 2)  # profiled activations at max_num_batched_tokens
    pool = int(0.8 * 64 * GIB)
    assert est.kv_available == pool - rollout_w - derived - act
    rollout = est.phases[2]
    assert rollout.total == pool  # offloaded actor and reference: only vLLM's pool on the device
    assert (
        est.phases[1].total
        == stage7 * 2 + (34 * seq * 4 * h + seq * 4 * 8 * (2 * 2048 + h) * 2) // 2 + seq * 4 * vocab * 4
    )


def test_pipeline_layers():
    assert M.pipeline_layers(61, 8, 6, 7) == [6, 8, 8, 8, 8, 8, 8, 7]
    assert M.pipeline_layers(61, 8, 5, 7) is None
    assert M.pipeline_layers(60, 4, None, None) == [15, 15, 15, 15]
    assert M.pipeline_layers(61, 1, None, None) == [61]


def test_cli_prints_a_table_and_exits_1_on_failure(capsys, tmp_path):
    out_json = tmp_path / "plan.json"
    assert cli_main(["plan", FLAGSHIP, "--no-env", "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "WARN  Megatron seq_length >= prompt + response" in text and "memory per rank (GiB)" in text
    assert json.loads(out_json.read_text())["ok"] is True
    assert (
        cli_main(["plan", FLAGSHIP, "--no-env", "verl.actor_rollout_ref.rollout.max_num_batched_tokens=1024"])
        == 1
    )
    text = capsys.readouterr().out
    assert (
        "FAIL  max_num_batched_tokens >= max_model_len" in text
        and "fix: set rollout.max_num_batched_tokens" in text
    )


@pytest.mark.every_stack  # the session's environment against its own stack's lock
def test_versions_and_node_environment_on_this_machine(monkeypatch):
    """A recipe on this kind of machine (hardware=cpu) runs the version and environment rules here: the
    environment must be the stack's lock."""
    from importlib import metadata

    one = "tensor_model_parallel_size=1"
    cpu = [
        "hardware=cpu",
        *(f"verl.actor_rollout_ref.{w}.{one}" for w in ("actor.megatron", "ref.megatron", "rollout")),
    ]
    p = P.plan("qwen2.5-7b-a2", cpu)
    r = p.by_rule("versions: the environment is the lock")
    assert r.status == P.PASS and f"locks/{STACK}/cpu.txt" in r.values
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "2.5.1" if name == "torch" else real(name))
    r = P.plan("qwen2.5-7b-a2", cpu).by_rule("versions: the environment is the lock")
    assert r.status == P.FAIL and "torch 2.5.1 (lock 2.13.0+cpu)" in r.values
    assert f"make bootstrap STACK={STACK} PROFILE=cpu" in r.message
    monkeypatch.setattr(metadata, "version", real)
    monkeypatch.delenv("HCCL_SOCKET_IFNAME", raising=False)
    r = P.plan("qwen2.5-7b-a2", [*cpu, "launch.nodes=2", "launch.node_env=[HCCL_SOCKET_IFNAME]"]).by_rule(
        "HCCL_SOCKET_IFNAME"
    )
    assert r.status == P.FAIL and "export HCCL_SOCKET_IFNAME=" in r.message and "lo" in r.message
    monkeypatch.setenv("HCCL_SOCKET_IFNAME", "lo")
    r = P.plan("qwen2.5-7b-a2", [*cpu, "launch.nodes=2", "launch.node_env=[HCCL_SOCKET_IFNAME]"]).by_rule(
        "HCCL_SOCKET_IFNAME"
    )
    assert r.status == P.PASS
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the recipe exports lo: the run would use lo
    r = P.plan("qwen2.5-7b-a2", cpu).by_rule("environment variables")
    assert r.status == P.WARN and "GLOO_SOCKET_IFNAME='eth7' (recipe 'lo')" in r.message


@pytest.mark.parametrize(
    ("node", "verdict"),
    [
        ({"cann": "8.2.RC1", "torch-npu": "2.5.1.post1", "torch": "2.5.1"}, "published"),
        (
            {"cann": "9.1.0", "torch-npu": "2.10.0.post4", "torch": "2.10.0", "triton-ascend": "3.2.2"},
            "current",
        ),
        ({"cann": "8.0.0", "torch-npu": None, "torch": "2.13.0"}, None),
    ],
)
def test_an_npu_node_whose_cann_and_torch_npu_fit_another_stack_is_refused_naming_it(
    monkeypatch, node, verdict
):
    """On an NPU node the planner reads CANN, torch-npu and torch and refuses a stack that needs others."""
    monkeypatch.setattr(P.machine, "detect_profile", lambda: "npu")
    monkeypatch.setattr(stacks, "installed_npu_versions", lambda: node)
    for name in stacks.load():
        r = P.plan("qwen2.5-7b-a2", stack=name).by_rule("versions: CANN, torch-npu, torch")
        if name == verdict:
            assert r.status == P.PASS, r
        else:
            assert r.status == P.FAIL
            want = (
                f"stack {verdict} fits this node: use STACK={verdict}"
                if verdict
                else "no stack fits this node"
            )
            assert want in r.message, r.message


# ---- the flagship's layout in miniature: the same rules fail the small and the 671B layout

TINY = "tiny-cpu-parallel"
MEG = "verl.actor_rollout_ref.actor.megatron."
OTC = MEG + "override_transformer_config."


@pytest.mark.every_stack  # the recipe runs on every stack, each with its own overlay
def test_the_small_parallel_layout_passes():
    p = P.plan(TINY, check_machine=False)
    assert p.ok, P.render(p)
    assert p.by_rule("pipeline layers sum to the layer count").values.startswith("[2, 2] = 4 of 4 layers")
    assert p.by_rule("actor EP divides the experts").values == "8 experts / EP2 = 4 a rank"
    assert p.by_rule("ETP x EP x PP divides world").values.endswith("world 4, expert-DP 1")
    assert p.by_rule("actor TP x PP x CP divides world").values.endswith("world 4, DP 2")
    assert p.by_rule("reference uses the actor's layout").status == P.PASS


SAME_RULE = [
    # (what is broken, small layout's overrides, 671B layout's overrides, the rule both must fail)
    (
        "EP does not divide the experts",
        [MEG + "expert_model_parallel_size=3"],
        [MEG + "expert_model_parallel_size=48"],
        "actor EP divides the experts",
    ),
    (
        "PP does not divide the layers",
        ["launch.devices_per_node=6", MEG + "pipeline_model_parallel_size=3"],
        [OTC + "num_layers_in_first_pipeline_stage=null", OTC + "num_layers_in_last_pipeline_stage=null"],
        "pipeline layers sum to the layer count",
    ),
    (
        "the world does not fit the layout",
        ["launch.devices_per_node=3"],
        ["launch.nodes=15"],
        "ETP x EP x PP divides world",
    ),
    (
        "TP x PP does not divide the world",
        ["launch.devices_per_node=6", MEG + "pipeline_model_parallel_size=4"],
        [MEG + "tensor_model_parallel_size=3"],
        "actor TP x PP x CP divides world",
    ),
]


@pytest.mark.every_stack
@pytest.mark.parametrize("what,small,big,rule", SAME_RULE, ids=[s[0] for s in SAME_RULE])
def test_a_broken_small_layout_fails_the_rule_that_fails_the_671b_layout(what, small, big, rule):
    results = {}
    for recipe, overrides in ((TINY, small), (FLAGSHIP, big)):
        p = P.plan(recipe, overrides, check_machine=False)
        results[recipe] = p.by_rule(rule)
        assert not p.ok, P.render(p)
        assert results[recipe].status == P.FAIL, (recipe, what, P.render(p))
        assert results[recipe].message, (recipe, rule)  # a fix is named
    # and the unbroken layouts pass that rule
    for recipe in (TINY, FLAGSHIP):
        assert P.plan(recipe, check_machine=False).by_rule(rule).status == P.PASS


# ---- MindSpeed's per-stage layer list ------------------------------------------------------------

NO_FIRST_LAST = [
    OTC + "num_layers_in_first_pipeline_stage=null",
    OTC + "num_layers_in_last_pipeline_stage=null",
]
LIST = "+" + OTC + "pipeline_num_transformer_layers="


def test_a_right_layer_list_without_megatrons_keys_is_understood_and_the_missing_keys_named():
    p = P.plan(FLAGSHIP, [*NO_FIRST_LAST, LIST + "[6,8,8,8,8,8,8,7]"], check_machine=False)
    layout = p.by_rule("pipeline layers sum to the layer count")
    assert layout.status == P.PASS, P.render(p)
    assert layout.values.startswith("[6, 8, 8, 8, 8, 8, 8, 7] = 61 of 61 layers")
    assert "pipeline_num_transformer_layers: 8 entries" in layout.values
    keys = p.by_rule("Megatron's first/last-stage keys match the layer list")
    assert keys.status == P.FAIL
    assert "num_layers_in_first_pipeline_stage=6 num_layers_in_last_pipeline_stage=7" in keys.message
    assert "\n" not in keys.message


@pytest.mark.every_stack
def test_the_layer_list_fix_names_the_megatron_core_of_the_stack_planned():
    from tools import stacks
    from tools.patches.config import load_upstreams

    stack = stacks.resolve(None).name
    pinned = load_upstreams(stack=stack)["megatron"].pypi.version
    p = P.plan(FLAGSHIP, [*NO_FIRST_LAST, LIST + "[6,8,8,8,8,8,8,7]"], check_machine=False)
    message = p.by_rule("Megatron's first/last-stage keys match the layer list").message
    assert f"megatron-core {pinned} builds the stages" in message, (stack, message)


def test_a_layer_list_with_matching_keys_passes():
    for given in ("[6,8,8,8,8,8,8,7]", "[[6],[8],[8],[8],[8],[8],[8],[7]]"):
        p = P.plan(FLAGSHIP, [LIST + given], check_machine=False)
        assert p.ok, P.render(p)
        assert p.by_rule("Megatron's first/last-stage keys match the layer list").status == P.PASS
        assert p.by_rule("pipeline layers sum to the layer count").values.startswith(
            "[6, 8, 8, 8, 8, 8, 8, 7]"
        )
    # the small layout, an even list without first/last: Megatron's even split is the same
    p = P.plan(TINY, [LIST + "[2,2]"], check_machine=False)
    assert p.ok, P.render(p)


@pytest.mark.parametrize(
    "given,values,fix",
    [
        ("[6,8,8,8,8,8,8,8]", ["= 62 of 61 layers", "8 entries"], ["needs PP=8 entries", "summing to 61", "it has 8 summing to 62"]),
        ("[6,8,8,8,8,8,15]", ["= 61 of 61 layers", "7 entries"], ["needs PP=8 entries", "it has 7 summing to 61"]),
        ("[0,8,8,8,8,8,8,13]", ["8 entries"], ["each > 0"]),
        ("[a,b]", ["pipeline_num_transformer_layers="], ["not a layer count", "one entry a stage"]),
    ],
    ids=["sum", "length", "empty stage", "not numbers"],
)  # fmt: skip
def test_a_wrong_layer_list_fails_naming_the_list(given, values, fix):
    p = P.plan(FLAGSHIP, [*NO_FIRST_LAST, LIST + given], check_machine=False)
    r = p.by_rule("pipeline layers sum to the layer count")
    assert r.status == P.FAIL and not p.ok
    for w in values:
        assert w in r.values, (w, r.values)
    for w in fix:
        assert w in r.message, (w, r.message)
    assert "pipeline_num_transformer_layers" in r.message or "pipeline_num_transformer_layers" in r.values


def test_a_layer_list_disagreeing_with_megatrons_keys_fails():
    p = P.plan(FLAGSHIP, [LIST + "[7,8,8,8,8,8,8,6]"], check_machine=False)
    r = p.by_rule("Megatron's first/last-stage keys match the layer list")
    assert r.status == P.FAIL
    assert "num_layers_in_first_pipeline_stage=7 num_layers_in_last_pipeline_stage=6" in r.message
    uneven_middle = P.plan(FLAGSHIP, [*NO_FIRST_LAST, LIST + "[6,8,9,7,8,8,8,7]"], check_machine=False)
    r = uneven_middle.by_rule("Megatron's first/last-stage keys match the layer list")
    assert r.status == P.FAIL and "make the middle stages equal" in r.message


def test_the_recipe_alone_skips_what_needs_the_stacks_trees(monkeypatch):
    """`make plan NO_ENV=1` where only another stack is bootstrapped: this stack's verl and megatron-core
    trees are not made, so the two rules that read them are skipped with the reason (a full plan fails)."""
    from tools.errors import UserError
    from tools.launch.plan import recipe as plan_recipe

    def missing(stack=None):
        raise UserError("verl's trainer configs are missing at third_party/verl/verl/trainer/config")

    monkeypatch.setattr(plan_recipe.R, "verl_config_dir", missing)
    from tools.launch import mcore_fields

    for module in (plan_recipe, mcore_fields):  # megatron-core's source not there: no field known
        monkeypatch.setattr(module, "transformer_config_fields", lambda mla=True, root=None: frozenset())
    rules = ("verl accepts every key", "transformer overrides known")
    p = P.plan("deepseek-v3-671b-a3", [], check_machine=False)
    assert p.ok, P.render(p)
    for rule in rules:
        assert p.by_rule(rule).status == P.SKIP and "make bootstrap STACK=" in p.by_rule(rule).message
    p = P.plan("deepseek-v3-671b-a3", [], check_machine=True)
    assert [p.by_rule(rule).status for rule in rules] == [P.FAIL, P.FAIL]
