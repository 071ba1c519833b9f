from pathlib import Path

import dagster as dg
from pydantic import Field

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions
from dagster_project.generation.ledger import FleetLedger
from dagster_project.resources.config_fields import config_fields
from dagster_project.sglang.launch import Fleet


class SGLangFleet(config_fields(DispatchOptions, dg.ConfigurableResource)):
    """Connects to a running SGLang fleet; it never launches servers (the fleet outlives runs).

    Endpoints come from `endpoints`, or one `router_url`, or the fleet record written by `dflash fleet up`
    (read at run time, so a restarted fleet is picked up by the next run). The dispatch options (windows,
    retries, timeouts, probes) are this resource's config too.
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

    def known_endpoints(self) -> list[str]:
        """The router, else the endpoints, else the servers of the recorded fleet; empty when none is known."""
        if self.router_url:
            return [self.router_url]
        if self.endpoints:
            return list(self.endpoints)
        fleet = Fleet.load(Path(self.fleet_dir)) if self.fleet_dir else None
        return fleet.urls if fleet is not None and fleet.members else []

    def resolve_endpoints(self) -> list[str]:
        """The endpoints to generate with; a run without any fails saying how to configure them."""
        endpoints = self.known_endpoints()
        if not endpoints:
            raise dg.Failure(
                "No SGLang endpoints configured: set DFLASH_SGLANG_ENDPOINTS, DFLASH_SGLANG_ROUTER, "
                f"or start a fleet with `dflash fleet up` (no fleet recorded in {self.fleet_dir})."
            )
        return endpoints

    def dispatcher(self) -> Dispatcher:
        """A dispatcher for one shard run; every run with the same fleet directory shares its ledger."""
        return Dispatcher(
            self.resolve_endpoints(),
            self.to_dataclass(),
            api_key=self.api_key,
            windows={self.router_url: self.router_window} if self.router_url else None,
            ledger=FleetLedger(Path(self.fleet_dir) / "ledger") if self.fleet_dir else None,
            load_sources={self.router_url: self.router_workers} if self.router_url and self.router_workers else None,
        )
