"""Dataclasses as the JSON objects the store holds: manifests, heartbeats, reports.

Writing is orjson's own dataclass serialization (the JSON of `dataclasses.asdict`), so the JSON keys are the
field names. Reading tolerates change in both directions, so stores written by other versions still read: keys a
newer writer added are ignored, and fields an older writer did not know take their defaults. Nested dataclasses
(also inside lists, tuples, dict values and `X | None`) are rebuilt from the field annotations, and so are the
integer keys of a `dict[int, ...]` (written as strings: `to_json(..., int_keys=True)`).

`read_record` reads one from the store; an object that is not a valid record (truncated, hand-edited, another
kind) raises `CorruptObject` naming the object, never a bare JSON error.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

import orjson

from dagster_project.store.storage import CorruptObject, Store

T = TypeVar("T")


def to_json(record: Any, *, int_keys: bool = False) -> bytes:
    # orjson writes a dataclass as the object of its fields, in order: asdict()'s JSON without its deep copy
    # (which was about an eighth of publishing 1,830 shards).
    return orjson.dumps(record, option=orjson.OPT_INDENT_2 | (orjson.OPT_NON_STR_KEYS if int_keys else 0))


def from_json(kind: type[T], raw: bytes) -> T:
    return from_dict(kind, orjson.loads(raw))


def from_dict(kind: type[T], data: Mapping[str, Any]) -> T:
    arguments = {}
    for name, nested in _fields_to_read(kind):
        if name in data:
            value = data[name]
            arguments[name] = value if nested is None else _build(nested, value)
    return kind(**arguments)


@functools.cache
def _fields_to_read(kind: type) -> tuple[tuple[str, Any], ...]:
    """(name, annotation) of the fields `kind` is built from; the annotation only where a dataclass or an integer
    key is nested in it, None where the JSON value is used as read (worked out once per class: rows are read by
    the million)."""
    hints = typing.get_type_hints(kind)
    return tuple((f.name, hints[f.name] if _needs_building(hints[f.name]) else None) for f in fields(kind) if f.init)


@functools.cache
def _needs_building(hint: Any) -> bool:
    args = typing.get_args(hint)
    int_keyed = typing.get_origin(hint) is dict and len(args) == 2 and args[0] is int
    return is_dataclass(hint) or int_keyed or any(_needs_building(arg) for arg in args)


def _build(hint: Any, value: Any) -> Any:
    if value is None or not _needs_building(hint):
        return value
    if is_dataclass(hint):
        return from_dict(hint, value)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        arms = [arm for arm in args if arm is not type(None)]
        return _build(arms[0], value) if len(arms) == 1 else value
    if origin in (list, tuple) and args:
        return origin(_build(args[0], item) for item in value)
    if origin is dict and len(args) == 2:
        return {(int(key) if args[0] is int else key): _build(args[1], item) for key, item in value.items()}
    return value


def read_record(store: Store, key: str, kind: type[T]) -> T | None:
    """The record stored at `key` as `kind`, or None when there is no such object (one request, not two)."""
    found = store.get_versioned(key)
    return None if found is None else parse_record(store, key, kind, found[0])


def parse_record(store: Store, key: str, kind: type[T], raw: bytes) -> T:
    """`raw`, the bytes of object `key`, as a `kind`; `CorruptObject` naming the object when they are not one."""
    try:
        return from_json(kind, raw)
    except (ValueError, TypeError, AttributeError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise CorruptObject(
            f"{store.url(key)} is damaged: it is not a valid {kind.__name__} ({type(exc).__name__}: {exc}). "
            "Re-materialize the asset that wrote it (or delete the object if it should not be there)"
        ) from exc
