"""The radix cache as a client sees it: `cached_tokens` of a prompt whose prefix an earlier request left behind.

SGLang 0.5.23 keeps every finished request's tokens (prompt and answer) in its radix tree unless launched with
`--disable-radix-cache`, and reports how many of a new prompt's leading tokens it found there, never the whole
prompt (the last token is always computed, for its logits). The simulator keeps digests of the prefixes at every
64-token block and at each sequence's own length less one, in a bounded LRU: a repeated prompt is found to its
last token, a longer prompt that extends an earlier conversation to the block its shared part reaches.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence

BLOCK_TOKENS = 64
DEFAULT_LIMIT = 50_000  # prefix digests kept (~100 bytes each): the real tree is bounded by its KV pool


class PrefixCache:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        self._digests: OrderedDict[bytes, None] = OrderedDict()

    def match(self, input_ids: Sequence[int]) -> int:
        """Leading tokens of `input_ids` found in the cache (at most all but the last)."""
        best = 0
        for length, digest in _prefix_digests(input_ids, len(input_ids) - 1):
            if digest in self._digests:
                self._digests.move_to_end(digest)
                best = length
        return best

    def insert(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """A finished request's tokens (its prompt and answer) stay in the tree: the same prompt again is found to
        its last token, a conversation that goes on from the answer to the last block they share."""
        for sequence in (prompt, [*prompt, *output]):
            for _, digest in _prefix_digests(sequence, len(sequence) - 1):
                self._digests[digest] = None
                self._digests.move_to_end(digest)
        while len(self._digests) > self._limit:
            self._digests.popitem(last=False)


def _prefix_digests(token_ids: Sequence[int], tail: int) -> Iterator[tuple[int, bytes]]:
    """(length, digest) of the prefixes at every block boundary below `tail`, then of the first `tail` tokens."""
    if tail <= 0:
        return
    raw = array("q", token_ids[:tail]).tobytes()
    width = array("q").itemsize
    running = hashlib.blake2b(digest_size=16)
    at = 0
    for end in range(BLOCK_TOKENS, tail, BLOCK_TOKENS):
        running.update(raw[at * width : end * width])
        at = end
        yield end, running.copy().digest()
    running.update(raw[at * width :])
    yield tail, running.digest()
