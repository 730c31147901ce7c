"""Calls whose work grows with what the master holds stay bounded on its event loop
(master/state.py): a ListKeys answer holds at most MAX_LIST_PAGE keys whatever the caller
asks, the rest a page away; a tenant's RemovePrefix looks at that tenant's objects only."""

from __future__ import annotations

from state_helpers import mount, new_state, publish, put

from kvpool.common.status import KeyStatus
from kvpool.master import state as state_module


def test_a_listing_asks_for_more_than_a_page_and_gets_a_page_and_where_to_go_on(monkeypatch):
    monkeypatch.setattr(state_module, "MAX_LIST_PAGE", 10)
    state, _ = new_state()
    mount(state, "n1")
    for i in range(25):
        publish(state, f"t/k{i:02d}", 64)
    seen: list[str] = []
    after = ""
    while True:
        page = state.list_keys("t/", 1_000_000, after)
        assert len(page.keys) <= 10
        seen += page.keys
        if not page.next_start_after:
            break
        after = page.next_start_after
    assert seen == [f"t/k{i:02d}" for i in range(25)], "every key once, in order"


def test_a_tenants_prefix_removal_removes_its_own_and_leaves_the_others_alone():
    state, _ = new_state()
    mount(state, "n1")
    for tenant in ("a", "b"):
        for i in range(3):
            publish(state, f"{tenant}/logs/{i}", 64)
        put(state, f"{tenant}/logs/writing", 64)  # (a reservation: not ready)
    removal = state.remove_prefix("a/logs/")
    assert (removal.removed, removal.not_ready) == (3, 1)
    assert sorted(k for k in state.objects if k.startswith("b/")) == [
        "b/logs/0",
        "b/logs/1",
        "b/logs/2",
        "b/logs/writing",
    ]
    removal = state.remove_prefix("b/logs/", force=True)
    assert removal.removed == 4 and state.exists(["b/logs/0"], 0)[0] is KeyStatus.NOT_FOUND
