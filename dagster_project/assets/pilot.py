"""The `pilot` asset: a stratified ~0.2% of the conversations generated and gated before the job
(`dagster_project/pilot/`); the shards refuse to start until a pilot of their settings has passed."""

# No `from __future__ import annotations` here: Dagster 1.13 cannot resolve a string-annotated Config parameter.
import tempfile
from pathlib import Path

import dagster as dg

from dagster_project.assets.run_tags import tag_asset_run
from dagster_project.assets.tables import counts_table
from dagster_project.pilot.sample import PilotSampleOptions
from dagster_project.pilot.stage import PilotLimits, run_pilot
from dagster_project.pilot_record import PilotRecord, pilot_key
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.resources.config_fields import config_fields
from dagster_project.store import layout
from dagster_project.training.gate_sets import CompletionShareLimits
from dagster_project.training.gates import GateThresholds
from dagster_project.training.lengths import LengthGateOptions
from dagster_project.training.shards import AssemblyOptions
from dagster_project.training.tool_call_gate import ToolCallGateOptions

_GATE_OPTIONS = (GateThresholds, CompletionShareLimits, ToolCallGateOptions, LengthGateOptions, AssemblyOptions)


def _config_base() -> type:
    base = dg.Config
    for options in _GATE_OPTIONS:
        base = config_fields(options, base)
    return config_fields(PilotSampleOptions, base)


class PilotConfig(_config_base()):
    """The pilot's size, and the thresholds of its gates (the completions and training-set checks' defaults)."""

    def limits(self) -> PilotLimits:
        thresholds, shares, tool_calls, length, assembly = (self.to_dataclass(kind) for kind in _GATE_OPTIONS)
        return PilotLimits(thresholds, shares, tool_calls, length, assembly)


@dg.asset(
    deps=[layout.CONVERSATIONS],
    group_name="shards",
    kinds={"sglang"},
    pool="sglang_fleet",
    description="A stratified sample of the conversations (about 0.2%, every source x turn position x tool use) "
    "generated with the job's settings through the fleet and judged by every completions and training-set gate. "
    "The shards generate only once a pilot of their settings has passed; its measurements become the plan.",
)
def pilot(
    context: dg.AssetExecutionContext,
    config: PilotConfig,
    store: DatasetStore,
    tokenizer: TokenizerResource,
    fleet: SGLangFleet,
    generation: GenerationConfig,
) -> dg.MaterializeResult:
    tag_asset_run(context)
    data = store.open()
    # Without a fleet directory (endpoints configured) the pilot's dispatcher keeps its ledger here.
    with tempfile.TemporaryDirectory(prefix="dflash-pilot-ledger-") as ledger:
        record = run_pilot(
            data,
            tokenizer=tokenizer.load(),
            settings=generation.to_dataclass(),
            dispatcher=fleet.dispatcher(registry=data, ledger_dir=Path(ledger)),
            work_dir=store.local_dir(),
            options=config.to_dataclass(),
            limits=config.limits(),
            log=context.log.info,
            run_id=context.run_id,
        )
    metadata = {
        **pilot_metadata(record),
        "uri": dg.MetadataValue.path(data.url(pilot_key(record.settings_fingerprint))),
    }
    context.log.info(record.summary())
    if not record.passed:
        for name, message in record.failed_gates.items():
            context.log.error(f"pilot {name}: {message}")
        raise dg.Failure(
            description=f"{record.summary()}: the shards will not start with these settings; fix the cause and "
            "materialize the pilot again",
            metadata=metadata,
            allow_retries=False,
        )
    # Its version is the settings' fingerprint: a new pilot of the same settings leaves the shards current.
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(record.settings_fingerprint))


def pilot_metadata(record: PilotRecord) -> dict[str, object]:
    lengths = record.output_lengths
    gates = {name: ("BLOCKED" if name in record.failed_gates else "ok") for name in record.gates}
    return {
        "passed": record.passed,
        "settings_fingerprint": record.settings_fingerprint,
        "conversations": record.conversations,
        "answers": record.answers,
        "seconds": round(record.seconds, 2),
        "req_per_s": round(record.req_per_s, 3),
        "output_tok_per_s": round(record.output_tok_per_s, 1),
        "accept_length": round(record.accept_length, 3) if record.accept_length else "— (MTP off)",
        "error_share": round(record.error_share, 4),
        "avg_output_tokens": round(lengths.mean, 1),
        "output_tokens_percentiles": dg.MetadataValue.json(lengths.percentiles),
        "output_tokens_histogram": dg.MetadataValue.md(counts_table("output tokens", lengths.histogram)),
        "strata": dg.MetadataValue.md(counts_table("stratum", record.strata)),
        "gates": dg.MetadataValue.md(counts_table("gate", gates)),
    }
