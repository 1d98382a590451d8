"""Where the Serve loader puts a replica's weights: the `serve_load` section of `jobs/bench.py gpu`.

It calls the replica's own loader (`loading.load_state`, the function a Serve replica runs, with
`num_gpus` as deployment.application sets it for a GPU replica and `device` unset) on a tiny
random Qwen3 target written to a temporary folder (`target.source=local:`; the `random` source needs
SmolLM2's tokenizer from a pip package the GPU image does not have), serving `ar` and a random `dflash`
drafter, and records the device of every served model's target and drafter weights. On a CUDA machine
anything but the GPU is a failure (the section's figures stand, the run exits non-zero).
"""

from __future__ import annotations

import importlib.util
import tempfile

from lilicorr.bench.gpu_decode import TINY

SHAPE = [o for o in TINY if not o.startswith(("target.source=", "target.dtype="))]  # both set where it is written
SERVE_NEEDS = ("fastapi", "starlette", "pydantic")  # loading.load_state builds the app's ServerState


def write_local_target(directory: str, dtype: str) -> None:
    """A random Qwen3 of SHAPE and a word-level tokenizer over its vocabulary, saved as a `local:` folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from lilicorr.config import load_config
    from lilicorr.models.target import build_random_target

    cfg = load_config("tiny-random", ["target.source=random", f"target.dtype={dtype}", *SHAPE])
    specials = ["<unk>", "<pad>", "<eos>"]
    vocab = {w: i for i, w in enumerate(specials + [f"t{i}" for i in range(cfg.target.vocab_size - len(specials))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                            eos_token="<eos>").save_pretrained(directory)
    build_random_target(cfg.target).save_pretrained(directory)


def _devices(module) -> list[str]:
    return sorted({str(p.device) for p in module.parameters()} | {str(b.device) for b in module.buffers()})


def serve_placement(ctx) -> dict:
    from lilicorr.serve_apps.loading import ServeSpec, load_state, stop_all

    missing = [m for m in SERVE_NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"the Serve loader imports {', '.join(missing)}, not on this machine: carry their wheels "
                           f"to measure where it puts the weights")
    import torch

    dtype = "bfloat16" if ctx.dev.type == "cuda" else "float32"
    with tempfile.TemporaryDirectory() as d:
        write_local_target(d, dtype)
        # As deployment.application sizes a replica: num_gpus=1 on a GPU machine, device left to the loader.
        spec = ServeSpec(preset="tiny-random", overrides=[f"target.source=local:{d}", f"target.dtype={dtype}", *SHAPE],
                         systems=["ar", "dflash"], drafter="random", warmup=False, checkpoint_root=d,
                         num_gpus=1 if ctx.dev.type == "cuda" else 0,
                         torch_threads=torch.get_num_threads())  # the loader sets the thread count: keep ours
        state = load_state(spec)
        try:
            placed = {}
            for name, m in state.models.items():
                dec = m.engine.decoder
                placed[name] = {"target": _devices(dec.target)}
                if dec.runner.drafting is not None:
                    placed[name]["drafter"] = _devices(dec.runner.drafting.drafter)
        finally:
            stop_all(state.models)
    want = ctx.dev.type
    wrong = {f"{n}.{part}": devs for n, parts in placed.items() for part, devs in parts.items()
             if any(not dv.startswith(want) for dv in devs)}
    if wrong:
        ctx.fail("serve_load", f"the Serve loader left weights off {want}: {wrong}")
    return {"serve_weights_device": placed, "serve_on_expected_device": not wrong, "serve_expected_device": want}


def sections():
    from lilicorr.bench.sections import Section

    return (Section("serve_load", 30, serve_placement),)
