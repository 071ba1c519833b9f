# No `from __future__ import annotations` here: Dagster 1.13 cannot resolve a string-annotated Config parameter.
from dataclasses import asdict

import dagster as dg

from dagster_project.assets.run_tags import tag_asset_run
from dagster_project.assets.training_set import training_set
from dagster_project.resources import DatasetStore
from dagster_project.resources.config_fields import config_fields
from dagster_project.store import layout
from dagster_project.training import mixture
from dagster_project.training.mixture import MixtureOptions, markdown_table


class MixtureConfig(config_fields(MixtureOptions, dg.Config)):
    """When a source's or turn position's share counts as moved."""


@dg.asset(
    deps=[training_set, dg.AssetKey(layout.CONVERSATIONS)],
    group_name="operations",
    kinds={"duckdb"},
    description="The mixture of the training set per source and per turn position: input rows, quarantined and "
    "excluded by reason, rows and share, error and truncation rates, length, accept length and loss-mask "
    "percentiles; flags a share that moved between input and output. Also the dataset-wide length figures.",
)
def mixture_report(
    context: dg.AssetExecutionContext, config: MixtureConfig, store: DatasetStore
) -> dg.MaterializeResult:
    tag_asset_run(context)
    data = store.open()
    report = mixture.mixture_report(data, config.to_dataclass())
    mixture.write_report(data, report)
    for flagged in report.flagged:
        context.log.warning(
            f"{flagged}: its share of the training set moved by more than "
            f"{report.max_share_shift_points} points from its share of the input"
        )
    lengths = report.lengths
    return dg.MaterializeResult(
        metadata={
            "training_rows": report.training_rows,
            "flagged": dg.MetadataValue.json(report.flagged),
            "by_source": dg.MetadataValue.md(markdown_table(report.by_source, "source")),
            "by_turn_position": dg.MetadataValue.md(markdown_table(report.by_turn, "turn")),
            "share_by_source": dg.MetadataValue.json({g.name: g.share for g in report.by_source}),
            "input_share_by_source": dg.MetadataValue.json({g.name: g.input_share for g in report.by_source}),
            "accept_length_by_source": dg.MetadataValue.json({g.name: g.accept_length_mean for g in report.by_source}),
            "groups": dg.MetadataValue.json(
                {"by_source": [asdict(g) for g in report.by_source], "by_turn": [asdict(g) for g in report.by_turn]}
            ),
            "max_length": report.max_length,
            "rows_over_max_length": lengths.rows_over,
            "supervised_tokens_beyond_max_length": lengths.supervised_tokens_beyond,
            "supervised_share_beyond_max_length": lengths.lost_share,
            "length_histogram": dg.MetadataValue.json(lengths.histogram),
            "report": dg.MetadataValue.path(data.url(mixture.REPORT_KEY)),
        }
    )
