import dagster as dg

from dagster_project.assets.run_tags import tag_asset_run
from dagster_project.generation.served_model import ExpectedModel
from dagster_project.ops import tune, tune_render
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.resources.config_fields import config_fields
from dagster_project.store import layout


class FleetTuningConfig(config_fields(tune.TuneOptions, dg.Config)):
    """How the sweep runs: concurrencies, requests per point, the knee's share of the best throughput."""


def _point_metadata(point: tune.TunePoint) -> dict:
    return {
        "concurrency": point.concurrency,
        "output_tok_per_s": point.output_tok_per_s,
        "accept_length": point.accept_length or 0.0,
        "ttft_p50_s": point.ttft_p50_s or 0.0,
        "latency_p50_s": point.latency_p50_s or 0.0,
        "latency_p99_s": point.latency_p99_s or 0.0,
    }


_COLUMNS = {
    "server_setting": "string",
    "concurrency": "int",
    "cap": "int",
    "output_tok_per_s": "float",
    "req_per_s": "float",
    "accept_length": "float",
    "ttft_p50_s": "float",
    "ttft_p99_s": "float",
    "latency_p50_s": "float",
    "latency_p99_s": "float",
    "errors": "int",
}


def points_table(report: tune.TuneReport) -> dg.TableMetadataValue:
    return dg.MetadataValue.table(
        records=[dg.TableRecord({name: getattr(point, name) for name in _COLUMNS}) for point in report.points],
        schema=dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in _COLUMNS.items()]),
    )


@dg.asset(
    deps=[layout.CONVERSATIONS],
    group_name="operations",
    kinds={"sglang"},
    pool="sglang_fleet",
    description="`dflash tune` against the running fleet: output tok/s, accept length, TTFT and latency per client "
    "concurrency on a sample of the published prompts, the knee and the flags that run there. Not part of the "
    "shard job: materialize it when the fleet is up and idle.",
)
def fleet_tuning(
    context: dg.AssetExecutionContext,
    config: FleetTuningConfig,
    store: DatasetStore,
    tokenizer: TokenizerResource,
    fleet: SGLangFleet,
    generation: GenerationConfig,
) -> dg.MaterializeResult:
    tag_asset_run(context)
    options = config.to_dataclass()
    data = store.open()
    settings = generation.to_dataclass()
    if options.synthetic_prompt_tokens:
        tokens, seed = options.synthetic_prompt_tokens, options.seed
        prompts = tune.synthetic_prompts(tokenizer.load(), options.sample, tokens, seed)
        source = f"synthetic, {options.synthetic_prompt_tokens} tokens each"
    else:
        prompts = tune.conversation_prompts(data, tokenizer.load(), settings, options.sample, options.seed)
        source = "published conversations, first turns rendered as generation renders them"
    report = tune.sweep(
        [],
        prompts,
        tune.request_params(settings, options),
        options,
        endpoints=fleet.resolve_endpoints(),
        api_key=fleet.api_key,
        prompts_source=source,
        expected_model=fleet.to_dataclass(ExpectedModel).identity(),
        log=context.log.info,
    )
    tune_render.write_report(data, report)
    # One observation per point, in sweep order: the asset's plots then draw each measure against the sweep.
    for point in sorted(report.points, key=lambda p: (p.server_setting, p.concurrency)):
        context.log_event(dg.AssetObservation(asset_key=context.asset_key, metadata=_point_metadata(point)))
    knee, estimate = report.knee, report.knee_estimate
    return dg.MaterializeResult(
        metadata={
            "recommendation": report.recommendation,
            "recommended_flags": " ".join(report.recommended_flags),
            "speculative": report.speculative.verdict if report.speculative else "",
            "knee_concurrency": estimate.concurrency if estimate else 0,
            "knee_interval": f"{estimate.low}-{estimate.high} (80%)" if estimate else "",
            "knee_output_tok_per_s": knee.output_tok_per_s if knee else 0.0,
            "best_output_tok_per_s": report.best_output_tok_per_s,
            "points": points_table(report),
            "report": dg.MetadataValue.md(tune_render.render_markdown(report, chart=data.url(tune_render.CHART_KEY))),
            "chart": dg.MetadataValue.path(data.url(tune_render.CHART_KEY)),
            "uri": dg.MetadataValue.path(data.url(tune.REPORT_KEY)),
        }
    )
