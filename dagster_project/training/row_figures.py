"""Per-row figures of Arrow list columns (token ids, loss masks), one chunk at a time in plain numpy: the
layer under the quality gates (`training.gates`) and the export's supervised-span checks."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

ListColumn = pa.ListArray | pa.LargeListArray | pa.ChunkedArray | Sequence[Sequence[int]]


def list_chunks(lists: ListColumn) -> Iterator[pa.Array]:
    if isinstance(lists, pa.ChunkedArray):
        yield from lists.chunks
    elif isinstance(lists, pa.Array):
        yield lists
    else:
        yield pa.array(lists, type=pa.list_(pa.int32()))


def list_buffers(chunk: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0, flat values) of a list array, zero-copy where Arrow allows.

    `.values` ignores a slice's offset, so the values are cut to the rows' span and the offsets rebased.
    """
    offsets = chunk.offsets.to_numpy().astype(np.int64)
    values = chunk.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], values


def per_row(lists: ListColumn, figure: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    parts = [figure(*list_buffers(chunk)) for chunk in list_chunks(lists)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def row_of(offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return np.searchsorted(offsets, positions, side="right") - 1


def list_lengths(lists: ListColumn) -> np.ndarray:
    return per_row(lists, lambda offsets, values: np.diff(offsets))


def row_sums(lists: ListColumn) -> np.ndarray:
    """Per row, the sum of its values: for a loss mask, the supervised tokens as the mask itself says."""

    def sums(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
        running = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
        return running[offsets[1:]] - running[offsets[:-1]]

    return per_row(lists, sums)


def adjacent_per_row(lists: ListColumn, holds: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """Per row, how many positions i satisfy `holds(values[i], values[i+1])` with both inside the row."""

    def count(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
        at = holds(values[:-1], values[1:])
        # A pair must not straddle two rows: drop the one that starts at each row's last position.
        row_ends = offsets[1:-1] - 1
        at[row_ends[(row_ends >= 0) & (row_ends < at.size)]] = False
        return np.bincount(row_of(offsets, np.flatnonzero(at)), minlength=offsets.size - 1)

    return per_row(lists, count)


def supervised_pairs(loss_mask: ListColumn) -> np.ndarray:
    """Per row, the positions i with loss_mask[i] == loss_mask[i+1] == 1: the anchors DFlash can use."""
    return adjacent_per_row(loss_mask, lambda here, after: (here == 1) & (after == 1))


def id_bounds(lists: ListColumn) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the smallest and largest id (0 and -1 for an empty row)."""

    def bound(reduce: np.ufunc, empty: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        def figure(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
            result = np.full(offsets.size - 1, empty, dtype=np.int64)
            nonempty = np.flatnonzero(np.diff(offsets) > 0)
            if nonempty.size:
                result[nonempty] = reduce.reduceat(values.astype(np.int64), offsets[nonempty])
            return result

        return figure

    return per_row(lists, bound(np.minimum, 0)), per_row(lists, bound(np.maximum, -1))


def ids_digest(ids: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(ids, dtype=np.int32).tobytes(), digest_size=16).digest()


def row_digests(lists: ListColumn) -> list[bytes]:
    """A digest of each row's ids: equal digests, equal token sequences (e.g. "distinct prompts")."""
    keys: list[bytes] = []
    for chunk in list_chunks(lists):
        offsets, values = list_buffers(chunk)
        keys.extend(ids_digest(values[offsets[i] : offsets[i + 1]]) for i in range(offsets.size - 1))
    return keys


def split_by_mask(input_ids: ListColumn, loss_mask: ListColumn) -> tuple[pa.ListArray, pa.ListArray]:
    """(unsupervised part, supervised part) of each row: what the model read, and what it is trained to write."""
    prompts, supervised = [], []
    for ids_chunk, mask_chunk in zip(list_chunks(input_ids), list_chunks(loss_mask), strict=True):
        offsets, ids = list_buffers(ids_chunk)
        mask_offsets, mask = list_buffers(mask_chunk)
        if not np.array_equal(offsets, mask_offsets):
            raise ValueError("input_ids and loss_mask differ in length on some row")
        on = mask.astype(bool)
        supervised_offsets = np.concatenate([[0], np.cumsum(on)])[offsets].astype(np.int32)
        prompt_offsets = (offsets - supervised_offsets).astype(np.int32)
        supervised.append(pa.ListArray.from_arrays(pa.array(supervised_offsets), pa.array(ids[on], pa.int32())))
        prompts.append(pa.ListArray.from_arrays(pa.array(prompt_offsets), pa.array(ids[~on], pa.int32())))
    empty = pa.array([], pa.list_(pa.int32()))
    return (pa.concat_arrays(prompts) if prompts else empty, pa.concat_arrays(supervised) if supervised else empty)
