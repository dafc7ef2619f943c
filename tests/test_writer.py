"""A session's writes (vecgpt/writer.py): in order, acknowledged by ticket, from a thread or with the next round,
and a failed write's error raised by the next call."""

import numpy as np
import pytest

from vecgpt.errors import TextConflict, VecgptError
from vecgpt.meter import Metered, later
from vecgpt.writer import Writer


def rows(store, name: str, n: int) -> list:
    return [later.upsert(name, np.array([i]), np.full((1, 2), i, np.float32)) for i in range(n)]


@pytest.mark.parametrize("background", [True, False])
def test_writes_land_in_order_and_are_acknowledged_by_ticket(make_store, background):
    store = Metered(make_store("memory"))
    store.create("c", 2, "l2")
    writer = Writer(store, background)
    tickets = [writer.queue(call) for call in rows(store, "c", 5)]
    assert tickets == list(range(5))
    writer.wait(tickets[2])
    assert all(writer.acked(t) for t in tickets[:3])
    writer.wait()
    assert all(writer.acked(t) for t in tickets) and store.count("c") == 5
    counted = store.meter.summary()
    assert counted["by_kind"]["matrix"] >= 5 + 1  # every write is counted, with the create
    # from a thread, writes are no round trip; without one, they went out as one round when waited for
    assert counted["round_trips_by_kind"]["matrix"] == (1 if background else 2)


@pytest.mark.parametrize("background", [True, False])
def test_a_failed_write_is_raised_by_the_next_call_and_stops_the_writer(make_store, background):
    store = Metered(make_store("memory"))
    store.create("c", 2, "l2")
    store.write_text("t1", {"tokens": []}, None)
    writer = Writer(store, background)
    writer.queue(later.write_text("t1", {"tokens": [1]}, 5))  # not the stored version: a conflict
    writer.queue(rows(store, "c", 1)[0])
    with pytest.raises(TextConflict):
        writer.wait()
    with pytest.raises(TextConflict):  # and every call after it
        writer.queue(rows(store, "c", 1)[0])
    assert store.count("c") == 0  # nothing queued after the failed write landed


def test_writes_cut_short_by_ctrl_c_are_never_counted_as_landed(make_store):
    """Ctrl-C in a round that carries writes (an in-process store's: with the session's next search) can leave some
    of them landed and others not. A later round's acknowledgement must not count them (a text's record then claimed
    a candidates row that was never stored, and its resume failed): the writer stops, and says so."""
    store = Metered(make_store("memory"))
    store.create("c", 2, "l2")
    writer = Writer(store, background=False)
    tickets = [writer.queue(call) for call in rows(store, "c", 2)]
    calls, _ = writer.take()
    with pytest.raises(KeyboardInterrupt), writer.failing():
        store.together(calls[0])  # the first write landed, then the round was cut short
        raise KeyboardInterrupt
    with pytest.raises(VecgptError, match="cut short"):
        writer.wait()
    with pytest.raises(VecgptError, match="cut short"):
        writer.queue(rows(store, "c", 1)[0])
    assert not any(writer.acked(t) for t in tickets) and store.count("c") == 1
