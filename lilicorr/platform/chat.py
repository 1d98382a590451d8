"""Chat prompts: the target's chat template turned into generation-prompt token ids.

One neutral module used by regeneration, `jobs/generate.py`, evaluation and the Serve app, so that every
path builds exactly the prompt the target would see (pure Python; the tokenizer does the work).
"""

from __future__ import annotations


def render(tokenizer, messages: list[dict[str, str]], enable_thinking: bool) -> str:
    """The chat template over `messages` with the assistant generation prompt appended.

    `enable_thinking` is passed to every template; those without the variable (SmolLM2) ignore it,
    Qwen3's emits its empty think block when it is False (reasoning disabled, as in the paper).
    """
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=enable_thinking)


def prompt_ids(tokenizer, messages: list[dict[str, str]], enable_thinking: bool) -> list[int]:
    """Token ids of the generation prompt for the assistant turn after `messages`."""
    return list(tokenizer(render(tokenizer, messages, enable_thinking), add_special_tokens=False)["input_ids"])
