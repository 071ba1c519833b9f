"""How a dispatcher turns a server's reported running + queued into the load other nodes hold there."""

from __future__ import annotations

from dagster_project.generation.server_watch import next_foreign_load

WINDOW = 20


def test_this_nodes_own_requests_are_not_counted_twice():
    # The server runs 20: 12 of them this node's. Only 8 belong to others.
    assert next_foreign_load(8, 8, reported=20, node_in_flight=12) == (8, 8)
    # Nothing but this node's requests at the server: no foreign load, whatever its size.
    assert next_foreign_load(0, 0, reported=20, node_in_flight=20) == (0, 0)
    # Its requests still on the wire (in flight here, not yet at the server) never make the estimate negative.
    assert next_foreign_load(0, 0, reported=3, node_in_flight=5) == (0, 0)


def test_load_from_elsewhere_counts_at_once():
    assert next_foreign_load(2, 2, reported=20, node_in_flight=5) == (15, 15)


def test_room_that_appears_in_one_read_only_is_not_taken():
    # Another node's slot freed and not refilled yet at this read: the previous read still holds.
    assert next_foreign_load(15, 15, reported=14, node_in_flight=5) == (15, 9)


def test_room_is_taken_in_halves_once_two_reads_show_it():
    foreign, estimate = 15, 15
    history = []
    for _ in range(5):  # the other node left: the server holds only this node's 5
        foreign, estimate = next_foreign_load(foreign, estimate, reported=5, node_in_flight=5)
        history.append(foreign)
    assert history == [15, 7, 3, 1, 0]  # the first read alone could be a gap


def test_two_idle_nodes_starting_together_take_half_the_window_each():
    # Both start with the whole window unknown (foreign = window) and read an idle server.
    first_a, _ = next_foreign_load(WINDOW, 0, reported=0, node_in_flight=0)
    first_b, _ = next_foreign_load(WINDOW, 0, reported=0, node_in_flight=0)
    assert (WINDOW - first_a) + (WINDOW - first_b) == WINDOW
    # Each then holds 10 and sees the other's 10: neither grows.
    assert next_foreign_load(first_a, 0, reported=20, node_in_flight=10) == (10, 10)
