"""The vLLM half of `jobs/bench.py vllm-lilicorr-head`: run by .venv-vllm's python as a plain script, never imported.

    .venv-vllm/bin/python lilicorr/bench/vllm_lilicorr_head_side.py SPEC.json   -> one JSON line on stdout

It imports vllm, torch, safetensors and the standard library only (this venv has no lilicorr), and builds vLLM's
own `LiLiCorrHead` outside an engine as `LiLiCorrForCausalLM` would (`_head`; docs/vllm-lilicorr.md, step 4), in a
one-process model-parallel group (gloo): its linear layers ask for their rank.

SPEC: {"export": the LiLiCorrDraftModel folder, "target": the target's HF folder (its input embedding, as vLLM's
speculator embeds candidates with the target's `embed_tokens`), "lattices": a torch.save file of
{"cand_ids" (N, S, K) int64, "logprobs" (N, S, K) fp32, "slot_hidden" (N, S, H), "anchor_hidden" (N, H_d)},
"threads": torch threads (optional), "out": where to torch.save {"start" (N, K), "pair" (N, S-1, K, K),
"path" (N, S), "cand_ids", "logprobs" (N, S, K)}}.
The last two are vLLM's own candidates from the same slot hidden states (`candidates`), a check of the extraction
that feeds the head (the head itself is fed ours, so both heads see identical inputs).

Scores: `forward` returns logit_scale * [start broadcast to the first row; pairs] (N, S, K, K); start is its
[:, 0, 0], pair its [:, 1:]. The walk is the speculator's `_selector_walk_kernel` (dflash2/speculator.py, Triton,
GPU only) at temperature 0, re-stated here in torch: previous = 0; per step index = argmax of
scores[step, previous] (tl.max's index: the first maximum, as torch.argmax), previous = index.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def _head(export: str):
    import torch
    from safetensors.torch import load_file
    from vllm.config import CompilationConfig, CompilationMode, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.models.lilicorr import LiLiCorrHead
    from vllm.model_executor.models.utils import AutoWeightsLoader

    config = json.loads(open(os.path.join(export, "config.json")).read())
    vllm_config = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.NONE))  # eager, as on CPU
    init_file = os.path.join(tempfile.mkdtemp(prefix="vllm-llc-pg-"), "init")
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{init_file}")
        initialize_model_parallel(1)
        # LiLiCorr.__init__ (vllm/model_executor/models/lilicorr.py): these arguments, from the draft's hf_config
        dfl = dict(config["dflash_config"])
        block_size = dfl.get("block_size", config.get("block_size", 0))
        head = LiLiCorrHead(model_hidden_size=config["hidden_size"], block_size=block_size,
                            rms_norm_eps=config["rms_norm_eps"], config=dfl, quant_config=None, prefix="lilicorr")
    tensors = load_file(os.path.join(export, "model.safetensors"))
    weights = [(k.removeprefix("lilicorr."), v) for k, v in tensors.items() if k.startswith("lilicorr.")]
    loaded = AutoWeightsLoader(head).load_weights(weights)  # LiLiCorrForCausalLM.load_weights' head step
    params = {n for n, _ in head.named_parameters()}
    if params - set(loaded) or {n for n, _ in weights} - params:
        raise SystemExit(f"weights do not cover vLLM's LiLiCorrHead: missing {sorted(params - set(loaded))}, "
                         f"unused {sorted({n for n, _ in weights} - params)}")
    # The engine's order: LiLiCorrForCausalLM.load_weights ends with materialize_inference_buffers (it copies
    # out_head / in_head / factor_input_proj weights into fused buffers), then the model loader has each quant
    # method process its layer (on CPU dispatch_cpu_unquantized_gemm(remove_weight=True) empties `.weight`, so
    # the other order fails in materialize_inference_buffers).
    n_params = sum(p.numel() for p in head.parameters())  # before processing empties the linear layers' weights
    head.materialize_inference_buffers(torch.device("cpu"), torch.float32)
    for module in head.modules():
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
    return head.eval(), config, block_size, len(weights), n_params, vllm_config


def candidates(lm_weight, hidden, k: int):
    """LiLiCorrForCausalLM.compute_candidates: the LM head's top-k ids and full-vocabulary log-probs, through vLLM's
    own ParallelLMHead (its CPU GEMM) and LogitsProcessor.get_top_k_tokens(return_log_probs=True)."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    v, h = lm_weight.shape
    lm_head = ParallelLMHead(v, h, bias=False)
    lm_head.weight_loader(lm_head.weight, lm_weight)
    lm_head.quant_method.process_weights_after_loading(lm_head)
    return LogitsProcessor(v).get_top_k_tokens(lm_head, hidden, k, return_log_probs=True)


def walk(scores):
    """_selector_walk_kernel at temperature 0: scores (N, S, K, K) -> (N, S) candidate indices."""
    import torch

    n, steps = scores.shape[:2]
    previous = torch.zeros(n, dtype=torch.long)
    rows, path = torch.arange(n), []
    for step in range(steps):
        previous = scores[rows, step, previous].argmax(-1)
        path.append(previous)
    return torch.stack(path, 1)


def main(spec_path: str) -> dict:
    import torch
    from safetensors import safe_open

    spec = json.loads(open(spec_path).read())
    torch.manual_seed(0)
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    from vllm.config import set_current_vllm_config

    head, config, block_size, n_tensors, n_params, vllm_config = _head(spec["export"])
    with safe_open(os.path.join(spec["target"], "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight").float()  # (V, H): the target's input embedding
        lm_weight = f.get_tensor("lm_head.weight").float() if "lm_head.weight" in f.keys() else embed  # tied
    lat = torch.load(spec["lattices"], weights_only=True)
    n, s, k = lat["cand_ids"].shape
    with torch.no_grad():
        scores = head(embed[lat["cand_ids"]], lat["logprobs"].float(), lat["slot_hidden"].float(),
                      lat["anchor_hidden"].float(), torch.ones(n, dtype=torch.bool))  # (N, S, K, K)
        with set_current_vllm_config(vllm_config):  # its layers read the config when built
            ids, logprobs = candidates(lm_weight, lat["slot_hidden"].float().flatten(0, 1), k)
    out = {"start": scores[:, 0, 0].contiguous(), "pair": scores[:, 1:].contiguous(), "path": walk(scores),
           "cand_ids": ids.view(n, s, k), "logprobs": logprobs.view(n, s, k)}
    torch.save(out, spec["out"])
    import vllm

    return {"vllm_version": vllm.__version__, "torch_version": torch.__version__, "blocks": n,
            "head_tensors": n_tensors, "head_parameters": n_params,
            "rms_norm_eps": config["rms_norm_eps"], "block_size": block_size, "out": spec["out"]}


if __name__ == "__main__":
    # Run as a file, this folder is sys.path[0]: its modules (engine.py, ...) must not shadow vLLM's imports.
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
    print(json.dumps(main(sys.argv[1])), flush=True)
