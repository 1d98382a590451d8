"""Incremental detokenization and stop strings, for streamed and whole responses alike.

`IncrementalDetokenizer` turns token ids arriving a few at a time into text deltas whose concatenation
equals `tokenizer.decode(all_ids, skip_special_tokens=True)` (what `jobs/generate.py` writes). It decodes
only a short window: the ids since the last emitted boundary, compared with the same window minus the
newest ids; text is held back while it ends in U+FFFD (a multi-byte character split across tokens).

`TextStream` adds stop strings: text that could still turn into a stop string is held back, and once one
appears the text is cut before it (OpenAI's behaviour: the stop string is not returned).
"""

from __future__ import annotations

from typing import Optional, Sequence


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # window start: a character boundary
        self.read = 0  # ids up to here are already emitted as text

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, new_ids: Sequence[int], final: bool = False) -> str:
        """The text `new_ids` completes; `final`: also whatever is still held back (the ids end here, and a
        genuinely invalid byte sequence decodes as U+FFFD)."""
        self.ids.extend(int(t) for t in new_ids)
        before = self._decode(self.ids[self.prefix:self.read])
        now = self._decode(self.ids[self.prefix:])
        if final or (len(now) > len(before) and not now.endswith("\ufffd")):
            self.prefix, self.read = self.read, len(self.ids)
            return now[len(before):]
        return ""


class TextStream:
    """Token ids in, safe-to-send text out; `stopped` once a stop string appeared."""

    def __init__(self, tokenizer, stops: Sequence[str] = ()):
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = [s for s in stops if s]
        self.text = ""  # all text decoded so far (cut at a stop string once one is found)
        self.sent = 0  # characters of `text` already handed out
        self.stopped = False

    def _find_stop(self) -> Optional[int]:
        longest = max((len(s) for s in self.stops), default=0)
        start = max(0, self.sent - longest + 1)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def _held(self) -> int:
        """Characters at the end of `text` that are a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text) - self.sent), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def add(self, ids: Sequence[int], final: bool = False) -> str:
        """The text safe to send once `ids` arrived; `final`: all of it (the generation ended)."""
        if self.stopped:
            return ""
        self.text += self.detok.add(ids, final)
        if self.stops:
            cut = self._find_stop()
            if cut is not None:
                self.text, self.stopped = self.text[:cut], True
        end = len(self.text) if (final or self.stopped) else len(self.text) - self._held()
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out
