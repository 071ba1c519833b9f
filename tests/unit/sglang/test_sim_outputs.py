"""The simulator's speculative-decoding model, without a server: acceptance that degrades with context and batch."""

from __future__ import annotations

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.sim.outputs import AcceptModel


def test_acceptance_degrades_with_context_length():
    import random

    model = AcceptModel((0.2, 0.2, 0.2, 0.4), decay_tokens=16384, seed=0)
    short = model.draw(100, 2000, random.Random(1))
    long = model.draw(30000, 2000, random.Random(1))
    assert 2000 / short.verify > 2.5 > 2000 / long.verify > 1.2
    for draw in (short, long):
        meta = {
            "completion_tokens": 2000,
            "spec_verify_ct": draw.verify,
            "spec_num_correct_drafts": draw.correct,
            "spec_num_proposed_drafts": draw.verify * 3,
            "spec_correct_drafts_histogram": draw.histogram,
            "spec_accept_length": 2000 / draw.verify,
            "spec_accept_rate": draw.correct / (draw.verify * 3),
        }
        assert proto.check_spec_stats(meta) == []


def test_acceptance_degrades_with_batch_size():
    import random

    model = AcceptModel((0.2, 0.2, 0.2, 0.4), decay_tokens=0, seed=0, decay_batch=32)
    alone = model.draw(100, 2000, random.Random(1), batch=1)
    crowded = model.draw(100, 2000, random.Random(1), batch=65)  # halfway to no acceptance
    assert 2000 / alone.verify > 2.5 > 2000 / crowded.verify > 1.5
    assert model.draw(100, 2000, random.Random(1)).verify == alone.verify  # batch 1 is the default
