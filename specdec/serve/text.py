"""A request's text as its tokens arrive: incremental detokenization, stop strings, and what is safe to send.

Decoding the whole output every step costs O(length) per step per request; this decodes only a window: the text
of tokens[prefix:] minus the text of tokens[prefix:read], where `read` is how far the text is known and `prefix`
lags it by the tokens of the last piece (a tokenizer may render a token differently at the start of a sequence,
so the window always starts one piece back). Text ending in U+FFFD is a character whose bytes are still coming:
it waits. Text that could be the start of a stop string is held back from the stream until it cannot.
"""

from __future__ import annotations

from collections.abc import Callable


class IncrementalText:
    """decode: token ids -> text (special tokens skipped)."""

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]):
        self._decode = decode
        self.stop = stop
        self.tokens: list[int] = []
        self.prefix = self.read = 0
        self.text = ""     # all text known so far (cut at a stop string once one appears)
        self.sent = 0      # characters of text already handed out
        self.stopped = False

    def add(self, tokens: list[int], final: bool = False) -> None:
        """Append new tokens; final: the request ended, so an incomplete character is shown as it is."""
        if self.stopped:
            return
        self.tokens += tokens
        before = self._decode(self.tokens[self.prefix:self.read])
        after = self._decode(self.tokens[self.prefix:])
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            searched = max(len(self.text) - max((len(s) for s in self.stop), default=0) + 1, 0)
            self.text += after[len(before):]
            self.prefix, self.read = self.read, len(self.tokens)
            cut = min((i for i in (self.text.find(s, searched) for s in self.stop) if i >= 0), default=-1)
            if cut >= 0:
                self.text, self.stopped = self.text[:cut], True

    def pending(self, final: bool = False) -> str:
        """Text not yet handed out that no stop string can still claim; marks it handed out."""
        end = len(self.text) if final or self.stopped else len(self.text) - self._held_back()
        piece = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return piece

    def _held_back(self) -> int:
        """The longest end of the text that is the start of a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:n]):
                    longest = n
                    break
        return longest
