"""Chat prompts: the target's chat template turned into generation-prompt token ids.

One neutral module used by regeneration, `jobs/generate.py`, evaluation and the Serve app, so that every
path builds exactly the prompt the target would see (pure Python; the tokenizer does the work).
"""

from __future__ import annotations

from typing import Optional


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


def end_of_turn_id(tokenizer) -> Optional[int]:
    """The special token the chat template writes right after an assistant message (ChatML's <|im_end|>), or None
    when the template has none there: what a generation must stop on to end the answer as the template does."""
    mark = "\u2063LILICORR-ANSWER\u2063"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": mark}],
                                             tokenize=False)
    except Exception:  # a template that refuses this minimal conversation says nothing here
        return None
    at = text.find(mark)
    after = tokenizer(text[at + len(mark):], add_special_tokens=False)["input_ids"] if at >= 0 else []
    specials = set(tokenizer.all_special_ids) | {i for t, i in tokenizer.get_added_vocab().items()}
    return after[0] if after and after[0] in specials else None
