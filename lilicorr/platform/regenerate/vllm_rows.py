"""What regeneration hands vLLM and how it reads vLLM's answers back: plain Python, no Ray and no vllm import.

Shared by the vllm backend's Ray Data LLM processor (vllm_processor.py) and by the offline check that runs vLLM's
own `LLM` under .venv-vllm, which has no Ray (bench/regen_vllm_side.py), so both send vLLM the same requests and
read its outputs with the same code. Prompts, loss masks and skips are built by actor.regenerate_rows around
`RequestGenerate`, exactly as for the other backends: this module only replaces the generate call.

Request row (`preprocess`: the input columns Ray 2.60's vLLM stage reads, llm/_internal/batch/stages/
vllm_engine_stage.py `_prepare_llm_request`):
  tokenized_prompt  the prompt's token ids (chat.prompt_ids already applied the template, so the processor's
                    chat-template, tokenize and detokenize stages are off)
  sampling_params   vllm.SamplingParams fields: temperature 0 (greedy), max_tokens = data.max_new_tokens,
                    stop_token_ids = our stop ids with ignore_eos=True, so vLLM stops on exactly the ids the engine
                    backend stops on and not on extra ids from the model's generation_config; detokenize=False
                    (regenerate_rows decodes the ids itself)
  request_key, prompt_len, max_new_tokens, stop_ids   ours, carried through untouched by Ray Data LLM

Output row fields read (`postprocess`): what Ray's vLLMOutputData.from_vllm_engine_output fills from a
vllm.RequestOutput, and what `output_row` fills from one in the offline check:
  generated_tokens     RequestOutput.outputs[0].token_ids (the stop id included when it stopped on one)
  prompt_token_ids     RequestOutput.prompt_token_ids
  __inference_error__  Ray's message for a request that failed (should_continue_on_error=True); "" otherwise
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

from lilicorr.platform.regenerate.conversations import EMPTY_GENERATION, GENERATE_ERROR, SkipConversation

ERROR = "__inference_error__"
# Columns the driver takes back from the processor (the engine stage adds timing, params, metrics, ...).
OUTPUT_COLUMNS = ("request_key", "prompt_len", "max_new_tokens", "stop_ids", "generated_tokens", "prompt_token_ids",
                  ERROR)
# vLLM needs an architecture name; a config converted from a GGUF (the embedded SmolLM2) carries none.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}

Generated = Union[list[int], SkipConversation]


def sampling_params(max_new_tokens: int, stop_ids: Sequence[int]) -> dict[str, Any]:
    """vllm.SamplingParams(**this): greedy, stopping exactly where the engine backend stops."""
    return {"temperature": 0.0, "max_tokens": int(max_new_tokens), "stop_token_ids": [int(t) for t in stop_ids],
            "ignore_eos": True, "detokenize": False}


def requests(prompts: list[list[int]], max_new_tokens: int, stop_ids: Sequence[int]) -> list[dict[str, Any]]:
    """One dataset row per prompt of a generate call; `request_key` is its index in the call."""
    return [{"request_key": k, "prompt_ids": [int(t) for t in p], "max_new_tokens": int(max_new_tokens),
             "stop_ids": [int(t) for t in stop_ids]} for k, p in enumerate(prompts)]


def preprocess(row: dict[str, Any]) -> dict[str, Any]:
    """A `requests` row -> the row Ray Data LLM's vLLM stage takes (its build_processor `preprocess`)."""
    prompt = [int(t) for t in row["prompt_ids"]]
    return {"request_key": int(row["request_key"]), "prompt_len": len(prompt),
            "max_new_tokens": int(row["max_new_tokens"]), "stop_ids": [int(t) for t in row["stop_ids"]],
            "tokenized_prompt": prompt, "sampling_params": sampling_params(row["max_new_tokens"], row["stop_ids"])}


def postprocess(row: dict[str, Any]) -> Generated:
    """A vLLM stage output row -> the generated ids (up to and including the first stop id, at most max_new_tokens),
    or a SkipConversation that regenerate_rows counts: a failed request, or one that came back with no token."""
    error = row.get(ERROR) or ""
    if error:
        return SkipConversation(GENERATE_ERROR, f"vLLM request failed: {error}")
    seen = len(_ids(row.get("prompt_token_ids")))
    if seen != int(row["prompt_len"]):  # vLLM must generate from our tokens (no BOS or template of its own)
        return SkipConversation(GENERATE_ERROR, f"vLLM saw a {seen}-token prompt, sent {int(row['prompt_len'])}")
    gen = _ids(row.get("generated_tokens"))
    stops = {int(t) for t in row["stop_ids"]}
    cut = next((i + 1 for i, t in enumerate(gen) if t in stops), len(gen))
    gen = gen[:min(cut, int(row["max_new_tokens"]))]
    if not gen:
        return SkipConversation(EMPTY_GENERATION, "vLLM returned no token for this turn")
    return gen


def _ids(value) -> list[int]:
    """A list column as ints: Ray Data hands list columns back as numpy arrays (no truth value), or None."""
    return [] if value is None else [int(t) for t in value]


def output_row(request: dict[str, Any], output: Any) -> dict[str, Any]:
    """The row Ray Data LLM's vLLM stage would emit for `request` (a `preprocess` row) and vLLM's RequestOutput
    `output`: the offline check's stand-in for the stage, reading the same RequestOutput fields Ray 2.60 reads."""
    kept = {k: v for k, v in request.items() if k not in ("tokenized_prompt", "sampling_params")}  # the stage pops them
    return {**kept, "generated_tokens": list(output.outputs[0].token_ids),
            "prompt_token_ids": list(output.prompt_token_ids), ERROR: ""}


class RequestGenerate:
    """A regenerate_rows generate function over `run`: request rows (`requests`) -> output rows, in any order.

    Each prompt's answer is matched by `request_key`; a prompt without an output row fails alone."""

    def __init__(self, run: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]):
        self.run = run

    def __call__(self, prompts: list[list[int]], max_new_tokens: int, stop_ids: list[int]) -> list[Generated]:
        if not prompts:
            return []
        by_key = {int(r["request_key"]): r for r in self.run(requests(prompts, max_new_tokens, stop_ids))}
        return [postprocess(by_key[k]) if k in by_key else SkipConversation(GENERATE_ERROR, "vLLM returned no row")
                for k in range(len(prompts))]


def model_source(target) -> str:
    """The folder or hub id vLLM loads for a TargetConfig (config/rules.py refuses target.source=random)."""
    from lilicorr.platform.assets import target_folder

    return target_folder(target)


def engine_kwargs(target, hf_config, max_model_len: int, tensor_parallel: int = 1,
                  extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """vLLM engine arguments (vllm.LLM(**...) / vLLMEngineProcessorConfig.engine_kwargs) for the target."""
    out: dict[str, Any] = {"dtype": target.dtype, "max_model_len": int(max_model_len),
                           "tensor_parallel_size": int(tensor_parallel), "seed": 0}
    if not getattr(hf_config, "architectures", None):
        out["hf_overrides"] = {"architectures": [ARCHITECTURES[target.arch]]}
    return {**out, **(extra or {})}
