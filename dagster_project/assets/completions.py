import dagster as dg

from dagster_project import layout, settings
from dagster_project.generation import generate_shard
from dagster_project.partitions import shard_partitions
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource


class CompletionsConfig(dg.Config):
    heartbeat_interval_s: float = 5.0


@dg.asset(
    partitions_def=shard_partitions,
    deps=[layout.CONVERSATIONS],
    group_name="generation",
    kinds={"sglang", "parquet"},
    pool="sglang_fleet",
    description="One generation event per assistant turn of the shard's conversations, from the SGLang fleet.",
)
def completions(
    context: dg.AssetExecutionContext,
    config: CompletionsConfig,
    store: DatasetStore,
    tokenizer: TokenizerResource,
    fleet: SGLangFleet,
    generation: GenerationConfig,
) -> dg.MaterializeResult:
    shard = layout.shard_index(context.partition_key)
    data = store.open()
    manifest = generate_shard(
        data,
        shard,
        tokenizer=tokenizer.load(),
        settings=generation.settings(),
        dispatcher=fleet.dispatcher(),
        work_dir=settings.work_dir(),
        heartbeat_interval_s=config.heartbeat_interval_s,
        log=context.log.info,
    )
    run = manifest["generation"]
    return dg.MaterializeResult(
        metadata={
            "rows": manifest["rows"],
            "ok": manifest["ok"],
            "errors": manifest["errors"],
            "errors_by_kind": dg.MetadataValue.json(run["errors_by_kind"]),
            "finish_reasons": dg.MetadataValue.json(run["finish_reasons"]),
            "output_tokens": manifest["output_tokens"],
            "avg_output_tokens": (manifest["output_tokens"] / manifest["ok"]) if manifest["ok"] else 0.0,
            "output_tok_per_s": run["lifetime"]["output_tok_per_s"],
            "spec_accept_length": run["spec"]["accept_length_lifetime"] or 0.0,
            "settings_fingerprint": manifest["settings_fingerprint"],
            "uri": dg.MetadataValue.path(data.url(layout.shard_prefix(layout.COMPLETIONS, shard))),
        }
    )
