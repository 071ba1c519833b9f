from dagster_project.ops.plan import MAX_TAIL_SHARE, ShardSizing, advise_shards

# A fleet of 336 running slots whose requests take 60 s each, 4 runs at a time: ~900K events.
FLEET = ShardSizing(events=900_000, fleet_cap=336, seconds_per_event=60.0, runs_at_once=4)


def test_a_costly_run_start_makes_shards_larger_until_its_cost_is_within_the_share():
    cheap, costly = advise_shards(FLEET), advise_shards(ShardSizing(**{**vars(FLEET), "run_overhead_s": 600.0}))
    assert costly.shards < cheap.shards
    assert costly.bound == "fixed cost per run"
    assert costly.overhead_share <= FLEET.max_overhead_share


def test_runs_stay_long_next_to_their_tails():
    advice = advise_shards(FLEET)
    assert advice.tail_share <= MAX_TAIL_SHARE
    assert advice.overhead_share <= FLEET.max_overhead_share
    assert advice.shards * advice.events_per_shard >= FLEET.events


def test_more_runs_at_once_allow_smaller_shards():
    wider = advise_shards(ShardSizing(**{**vars(FLEET), "runs_at_once": 16}))
    assert wider.shards > advise_shards(FLEET).shards


def test_a_small_job_still_gets_twice_as_many_shards_as_runs_at_once():
    advice = advise_shards(ShardSizing(**{**vars(FLEET), "events": 1_000}))
    assert advice.shards == 2 * FLEET.runs_at_once
    assert advice.bound == "twice the runs at once"
