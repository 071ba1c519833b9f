"""Dagster config and resource fields taken from a plain dataclass, so each knob has one default.

The logic modules declare their options as frozen dataclasses (no dagster there); the Dagster classes derive
their fields from them instead of copying each one:

    class GateConfig(config_fields(GateThresholds, dg.Config)):
        ...

    thresholds = config.to_dataclass()   # a GateThresholds with the run's values

Each field keeps its name, type and default, and its `metadata["help"]` becomes the description the
launchpad shows. Every field of such a dataclass has a default (or a default factory, for lists). A config
may take the fields of two dataclasses by nesting the calls; `to_dataclass(kind)` then builds the inner one:

    class CompletionsConfig(config_fields(ReportIntervals, config_fields(LeaseOptions, dg.Config))):
        ...

    config.to_dataclass(), config.to_dataclass(LeaseOptions)
"""

# No `from __future__ import annotations`: Dagster 1.13 cannot resolve string annotations of a Config.
import dataclasses
import typing

import pydantic
from pydantic import Field


def config_fields(source: type, base: type[pydantic.BaseModel]) -> type:
    """A subclass of `base` (`dg.Config` or `dg.ConfigurableResource`) with the fields of dataclass `source`,
    and `to_dataclass()`, which builds a `source` from the configured values."""
    types = typing.get_type_hints(source)  # real types: the logic modules' annotations are strings
    fields = {field.name: (types[field.name], _pydantic_field(field)) for field in dataclasses.fields(source)}

    class Fields(pydantic.create_model(f"{source.__name__}Fields", __base__=base, **fields)):
        def to_dataclass(self, kind: type | None = None):
            """A `source` with the configured values; or a `kind`, when `base` took its fields from it too."""
            kind = kind or source
            return kind(**{f.name: getattr(self, f.name) for f in dataclasses.fields(kind)})

    return Fields


def _pydantic_field(field: dataclasses.Field) -> typing.Any:
    description = field.metadata.get("help")
    if field.default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
        return Field(default_factory=field.default_factory, description=description)
    return Field(default=field.default, description=description)
