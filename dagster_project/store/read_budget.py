"""A store whose calls answer within a time budget, or raise `StoreSlow`: how `dflash status` stays within its
usual time when S3 answers every call late (issue 38: four status calls took 87-103 s each and blamed the fleet).

Each S3 call of the budgeted store runs on a daemon thread of its own and is waited for only until the budget
ends; a call still waiting then is abandoned, not cancelled (boto3 cannot cancel one), and being a daemon it does
not hold the process at exit. Every call after the budget ended raises at once. The reader decides what to show
instead (`dflash status`: its last snapshot of the store, `ops.status_snapshot`).

A local store is returned as it is: its calls are the machine's own disk, with no answer to wait for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from dagster_project.store.storage import S3Store, Store, StoreError


class StoreSlow(StoreError):
    """The store did not answer a read within the reader's budget."""

    def __init__(self, uri: str, budget_s: float, last_call_s: float | None):
        self.uri, self.budget_s = uri, budget_s
        # How long its last call took, or has waited so far: at least the budget when nothing answered in time.
        self.last_call_s = budget_s if last_call_s is None else max(last_call_s, 0.0)
        super().__init__(
            f"store slow: last call {self.last_call_s:.0f} s ({uri} did not answer within the budget of {budget_s:g} s)"
        )


class BudgetedS3Store(S3Store):
    """An `S3Store` (same client, retry policy and call timing) whose calls end by `budget_s` from its opening."""

    def __init__(self, store: S3Store, budget_s: float):
        super().__init__(store.uri, store.client, store.policy)
        self.budget_s = budget_s
        self._ends = time.monotonic() + budget_s
        # The first call the budget cut short: a reader that skips what fails to read (the watch reports) still
        # leaves its answer incomplete, which `overrun` tells.
        self.overrun: StoreSlow | None = None

    def slow(self) -> StoreSlow:
        if self.overrun is None:
            self.overrun = StoreSlow(self.uri, self.budget_s, self.last_call_s)
        return self.overrun

    def _retrying(self, action: str, key: str, call: Callable[[], Any]) -> Any:
        left = self._ends - time.monotonic()
        if left <= 0:
            raise self.slow()
        answer: Future[Any] = Future()
        retrying = super()._retrying

        def run() -> None:
            try:
                answer.set_result(retrying(action, key, call))
            except BaseException as exc:  # handed to the waiting reader, raised there
                answer.set_exception(exc)

        threading.Thread(target=run, name=f"store {action}", daemon=True).start()
        try:
            return answer.result(timeout=left)
        except TimeoutError:
            if answer.done():  # the call's own error, not the budget's end
                raise
            raise self.slow() from None


def within_budget(store: Store, budget_s: float | None) -> Store:
    """`store` with its calls bounded by `budget_s` from now (S3 only); None or 0: unbounded, `store` itself."""
    if not budget_s or not isinstance(store, S3Store):
        return store
    return BudgetedS3Store(store, budget_s)
