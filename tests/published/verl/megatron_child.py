"""One gloo rank of verl's Megatron actor path on CPU; run by test_megatron_cpu.py.

    python tests/published/verl/megatron_child.py <port> <hf model dir> <local-spec checkpoint> <out dir>

Builds the model as verl's Megatron worker does (verl.models.mcore: hf_to_mcore_config, init_mcore_model,
with the recipe's CPU overrides), loads the project's hf-to-mcore checkpoint with verl's
load_mcore_dist_weights, and runs verl's gptmodel_forward with the actor's logits processor on a
left-padded batch. Writes the log-probs and the full logits for the test to compare with transformers.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    port, hf_dir, ckpt, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    from verl.utils.device import get_nccl_backend

    dist.init_process_group(get_nccl_backend(), rank=0, world_size=1)
    from megatron.core import parallel_state, tensor_parallel
    from transformers import AutoConfig
    from verl.models.mcore import get_mcore_forward_fn, hf_to_mcore_config, init_mcore_model
    from verl.models.mcore.te_fallback import have_transformer_engine
    from verl.utils.model import load_mcore_dist_weights

    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(7)
    hf_config = AutoConfig.from_pretrained(hf_dir)
    tf = hf_to_mcore_config(
        hf_config,
        torch.float32,
        use_cpu_initialization=True,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        moe_grouped_gemm=False,
        moe_shared_expert_overlap=False,
        moe_token_dispatcher_type="allgather",
        variable_seq_lengths=False,
        sequence_parallel=False,
    )
    model = init_mcore_model(tf, hf_config, pre_process=True, post_process=True)
    names = [n for n, _ in model.named_parameters()]
    load_mcore_dist_weights([model], ckpt)
    model.eval()

    g = torch.Generator().manual_seed(3)
    b, s = 3, 10
    ids = torch.randint(4, hf_config.vocab_size, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[1, :3] = False  # left padding, as verl's batches have
    mask[2, :6] = False
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    label = torch.roll(ids, -1, dims=1)
    label_mask = mask.clone()
    label_mask[:, -1] = False

    def logits_processor(logits, label, label_mask):
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, label.unsqueeze(-1)).squeeze(-1)
        return {"log_probs": logp.masked_fill(~label_mask, 0.0), "logits": logits.clone()}

    forward = get_mcore_forward_fn(hf_config)
    with torch.no_grad():
        outd = forward(
            model,
            ids,
            mask,
            pos,
            sequence_parallel=False,
            logits_processor=logits_processor,
            logits_processor_args={"label": label, "label_mask": label_mask},
        )
    torch.save(
        {"ids": ids, "mask": mask, "pos": pos, "label": label, "label_mask": label_mask, **outd},
        os.path.join(out, "actor.pt"),
    )
    with open(os.path.join(out, "actor.json"), "w") as f:
        json.dump({"te": have_transformer_engine(), "names": names}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
