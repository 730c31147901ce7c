"""One long-lived real cluster per fuzzed surface (a module), watched from its first case to
its last: ``watch`` starts it with canaries, and at the end of the module checks them, the
master's memory and every process's log."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fuzzing import Watch, watched_cluster


@pytest.fixture(scope="module")
def watch(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Watch]:
    surface = request.module.SURFACE
    cluster, watch = watched_cluster(tmp_path_factory.mktemp(surface), surface)
    try:
        yield watch
        watch.finish()
    except BaseException:
        print(f"\n===== logs of {cluster.run_dir} =====\n{cluster.logs()}")
        raise
    finally:
        cluster.stop()
