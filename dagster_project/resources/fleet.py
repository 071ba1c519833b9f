from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from dagster_project.sglang.launch import Fleet

if TYPE_CHECKING:
    from dagster_project.generation.dispatch import Dispatcher


class SGLangFleet(dg.ConfigurableResource):
    """Connects to a running SGLang fleet; it never launches servers (DESIGN §4: the fleet outlives runs).

    Endpoints come from `endpoints`, or one `router_url`, or the fleet record written by `dflash fleet up`
    (read at run time, so a restarted fleet is picked up by the next run).
    """

    endpoints: list[str] = Field(default_factory=list, description="Server base URLs, e.g. http://gpu-node:30000.")
    router_url: str | None = Field(default=None, description="One sglang-router URL in front of the servers.")
    fleet_dir: str | None = Field(default=None, description="Run directory of `dflash fleet up` (its fleet.json).")
    api_key: str | None = Field(default=None, description="Bearer key of servers started with --api-key.")
    oversubscription: float = Field(default=1.5, description="In-flight window per server = effective cap x this.")
    router_window: int = Field(default=64, description="In-flight window for a router (it has no /server_info cap).")
    request_timeout_s: float = Field(default=3600.0, description="Thinking answers can take many minutes.")
    max_attempts: int = 4

    def resolve_endpoints(self) -> list[str]:
        if self.router_url:
            return [self.router_url]
        if self.endpoints:
            return list(self.endpoints)
        fleet = Fleet.load(Path(self.fleet_dir)) if self.fleet_dir else None
        if fleet is not None and fleet.members:
            return fleet.urls
        raise dg.Failure(
            "No SGLang endpoints configured: set DFLASH_SGLANG_ENDPOINTS, DFLASH_SGLANG_ROUTER, "
            f"or start a fleet with `dflash fleet up` (no fleet recorded in {self.fleet_dir})."
        )

    def dispatcher(self) -> Dispatcher:
        from dagster_project.generation.dispatch import Dispatcher

        return Dispatcher(
            self.resolve_endpoints(),
            api_key=self.api_key,
            oversubscription=self.oversubscription,
            request_timeout_s=self.request_timeout_s,
            max_attempts=self.max_attempts,
            windows={self.router_url: self.router_window} if self.router_url else None,
        )
