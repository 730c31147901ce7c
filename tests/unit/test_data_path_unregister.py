"""A buffer's registration outlives the transfers that may use it (client/data_path.py,
``unregister``): destroyed under a running UCX transfer, it could make UCX fault."""

from __future__ import annotations

import threading


def test_unregister_waits_for_the_transfers_running_then(data_path):
    """One of them may move bytes through the registration: it stays until they end. A
    transfer that starts after the call does not use it."""
    region = data_path.register(bytearray(1 << 16))
    with data_path._lock:
        data_path._active.add(-1)  # (a transfer running now)
    done = threading.Event()
    unregistering = threading.Thread(
        target=lambda: (data_path.unregister(region), done.set()), daemon=True
    )
    unregistering.start()
    assert not done.wait(0.3), "let go under a running transfer"
    assert region not in data_path._regions, "no new transfer finds it"
    with data_path._lock:
        data_path._active.discard(-1)  # (it ends)
        data_path._changed.notify_all()
    assert done.wait(5)
    assert region.memh is None
