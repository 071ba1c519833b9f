from pathlib import Path

import dagster as dg
from pydantic import Field

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions
from dagster_project.generation.fleet_registry import follow_registry, known_endpoints
from dagster_project.generation.ledger import FleetLedger
from dagster_project.generation.served_model import ExpectedModel
from dagster_project.generation.slot_use import SlotUse
from dagster_project.ops.answers.cost import FleetCost
from dagster_project.resources.config_fields import config_fields
from dagster_project.settings import DEFAULT_FLEET_STALE_AFTER_S
from dagster_project.store.storage import Store


class SGLangFleet(
    config_fields(DispatchOptions, config_fields(FleetCost, config_fields(ExpectedModel, dg.ConfigurableResource)))
):
    """Connects to a running SGLang fleet; it never launches servers (the fleet outlives runs).

    Endpoints come from `endpoints`, or one `router_url`, or the fleet registry in the store (every node's
    `dflash fleet up` registers its servers there, and a running shard re-reads it, so nodes may join while
    it runs), or this node's fleet record. The dispatch options (windows, retries, timeouts, probes) are this
    resource's config too, and so is the fleet's price
    (`cost_per_gpu_hour`, `gpus`), which `dflash status` and the run report turn into dollars, and the model every
    server must serve (`served_model`, ...: checked before a server's first request; Qwen3.6-27B by default).
    """

    endpoints: list[str] = Field(default_factory=list, description="Server base URLs, e.g. http://gpu-node:30000.")
    router_url: str | None = Field(default=None, description="One sglang-router URL in front of the servers.")
    router_window: int = Field(default=64, description="In-flight window for a router (it has no /server_info cap).")
    router_workers: list[str] = Field(
        default_factory=list,
        description="The servers behind `router_url` (its GET /workers lists them): their /metrics give its load.",
    )
    fleet_dir: str | None = Field(default=None, description="Run directory of `dflash fleet up` (its fleet.json).")
    api_key: str | None = Field(default=None, repr=False, description="Bearer key of servers started with --api-key.")
    stale_node_after_s: float = Field(
        default=DEFAULT_FLEET_STALE_AFTER_S,
        description="A registered node whose servers accept no connection and that has not run `fleet up` for this "
        "long is stale: not dispatched to, listed by `dflash status`.",
    )

    def cost(self) -> FleetCost:
        return self.to_dataclass(FleetCost)

    def _configured(self) -> list[str]:
        return [self.router_url] if self.router_url else list(self.endpoints)

    def known_endpoints(self, registry: Store | None = None) -> list[str]:
        """The router, else the endpoints, else every node's servers in `registry`, else this node's recorded
        fleet; empty when none is known."""
        return known_endpoints(self._configured(), registry, self.stale_node_after_s, self.fleet_dir)

    def resolve_endpoints(self, registry: Store | None = None) -> list[str]:
        """The endpoints to generate with; a run without any fails saying how to configure them."""
        endpoints = self.known_endpoints(registry)
        if not endpoints:
            raise dg.Failure(
                "No SGLang endpoints configured: set DFLASH_SGLANG_ENDPOINTS, DFLASH_SGLANG_ROUTER, "
                f"or start a fleet with `dflash fleet up` (no node registered in the store's fleet/, no fleet "
                f"recorded in {self.fleet_dir})."
            )
        return endpoints

    def dispatcher(
        self, registry: Store | None = None, slot_use: SlotUse | None = None, ledger_dir: Path | None = None
    ) -> Dispatcher:
        """A dispatcher for one shard run; every run with the same fleet directory shares its ledger. Unless
        endpoints or a router are configured, it follows `registry` while it runs: new nodes' servers join.
        `slot_use` measures the run's pool slot held with nothing in flight. `ledger_dir`: the ledger of the
        dispatchers of one run's shards when there is no fleet directory (the shards share the windows)."""
        follows_registry = registry is not None and not self._configured()
        ledger = Path(self.fleet_dir) / "ledger" if self.fleet_dir else ledger_dir
        return Dispatcher(
            self.resolve_endpoints(registry),
            self.to_dataclass(),
            api_key=self.api_key,
            windows={self.router_url: self.router_window} if self.router_url else None,
            ledger=FleetLedger(ledger) if ledger else None,
            discover=follow_registry(registry, self.stale_node_after_s) if follows_registry else None,
            load_sources={self.router_url: self.router_workers} if self.router_url and self.router_workers else None,
            slot_use=slot_use,
            expected_model=self.to_dataclass(ExpectedModel).identity(),
        )
