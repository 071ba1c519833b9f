"""One harness of the pipeline's promises (issue #43 item 9): small random jobs, built from a seed
(`jobs.build_job`), run through every stage on the simulator and moto with their faults (`run.run_job`), then
checked against the promises (`invariants.check_job`). `tests/integration/test_promises_harness.py` runs a fixed set
of seeds; `python -m benchmarks.soak_harness` (`make soak`) runs many more."""
