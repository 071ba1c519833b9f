import dagster as dg

from dagster_project import layout
from dagster_project.resources import DatasetStore, SGLangFleet
from dagster_project.status import collect_status, render_text


@dg.asset(
    deps=[layout.COMPLETIONS],
    group_name="report",
    kinds={"python"},
    description="The six operator questions (progress, MTP, concurrency, storage, coverage, multi-turn), "
    "computed like `dflash status` from heartbeats, manifests and the live fleet.",
)
def run_report(context: dg.AssetExecutionContext, store: DatasetStore, fleet: SGLangFleet) -> dg.MaterializeResult:
    try:
        endpoints = fleet.resolve_endpoints()
    except dg.Failure:
        endpoints = []  # no fleet running: the report still answers from the store
    status = collect_status(store.open(), endpoints, api_key=fleet.api_key)
    text = render_text(status)
    context.log.info("\n" + text)
    progress, storage = status["progress"], status["storage"]
    return dg.MaterializeResult(
        metadata={
            "report": dg.MetadataValue.md(f"```\n{text}\n```"),
            "status": dg.MetadataValue.json(status),
            "fraction_done": progress["fraction_done"],
            "events_done": progress["events_done"],
            "shards_published": storage["shards_published"],
            "mtp_on": status["mtp"]["mtp_on"],
        }
    )
