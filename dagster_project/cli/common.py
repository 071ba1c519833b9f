"""What the `dflash` commands share: the store as the settings name it, and flags made from option dataclasses.

Imports nothing heavy: `dflash status` must answer within about a second (see `dagster_project.cli`)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import TYPE_CHECKING, Any

from dagster_project import settings

if TYPE_CHECKING:
    from dagster_project.store.storage import Store


def open_configured_store() -> Store:
    """The store of `DFLASH_STORE`, opened as the `store` resource opens it with the configuration `dflash` gives
    it (none: the default retry policy, boto3's own settings chain), without building the Dagster resource."""
    from dagster_project.store.storage import RetryPolicy, bounded_client, open_store

    policy = RetryPolicy()
    return open_store(settings.store_uri(), lambda: bounded_client(policy), policy)


def known_fleet_endpoints(store: Store | None) -> list[str]:
    """The fleet as the settings name it (a router, the endpoints), else the store's live registered nodes (None: the
    store cannot be asked), else this node's recorded fleet; read as the fleet resource reads it, without building
    the resource (Dagster)."""
    from dagster_project.generation import fleet_registry

    router = settings.sglang_router()
    configured = [router] if router else settings.sglang_endpoints()
    return fleet_registry.known_endpoints(configured, store, settings.fleet_stale_after_s(), str(settings.fleet_dir()))


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_flags(
    parser: argparse.ArgumentParser,
    options: type,
    skip: set[str] = frozenset(),
    aliases: dict[str, list[str]] | None = None,
) -> None:
    """One flag per field of dataclass `options`, typed like it. A flag left out stays out of the parsed
    arguments, so the dataclass's own default applies (`given_flags`)."""
    types = typing.get_type_hints(options)
    for option in dataclasses.fields(options):
        if option.name in skip:
            continue
        flags = [option_flag(option.name), *(aliases or {}).get(option.name, [])]
        # The flag's type is the field's, without the None of an optional one (`int | None` → int); a list
        # of ints is given comma-separated.
        hint = types[option.name]
        kind = (
            _comma_ints
            if typing.get_origin(hint) is list
            else next(t for t in typing.get_args(hint) or [hint] if t is not type(None))
        )
        help_ = option.metadata.get("help")
        if kind is bool:
            parser.add_argument(*flags, dest=option.name, action="store_true", default=argparse.SUPPRESS, help=help_)
        else:
            shown = option.default not in (dataclasses.MISSING, None) and "default" not in (help_ or "")
            help_ = f"{help_} (default: {option.default})" if help_ and shown else help_
            parser.add_argument(*flags, dest=option.name, type=kind, default=argparse.SUPPRESS, help=help_)


def _comma_ints(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item.strip()]


def given_flags(args: argparse.Namespace, names: type | set[str]) -> dict[str, Any]:
    """The flags given on the command line among `names` (a set, or a dataclass's fields)."""
    if dataclasses.is_dataclass(names):
        names = {option.name for option in dataclasses.fields(names)}
    return {name: value for name, value in vars(args).items() if name in names}
