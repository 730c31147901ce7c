"""The copier behind same-host transfers: exact bytes, pieces shared between threads, and no
piece started after the deadline."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvpool.transport.memory_copy import PARALLEL_MIN, PIECE, Copier, Copy

SIZES = [0, 1, 4095, PIECE - 1, PIECE + 3, 3 * PIECE + 17]


def _copies(sources: list[np.ndarray], targets: list[np.ndarray]) -> list[Copy]:
    return [
        Copy(t.ctypes.data, s.ctypes.data, s.nbytes) for s, t in zip(sources, targets, strict=True)
    ]


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_every_byte_arrives_and_nothing_past_the_end(threads):
    rng = np.random.default_rng(7)
    sources = [rng.integers(0, 256, n, dtype=np.uint8) for n in SIZES]
    targets = [np.zeros(n + 8, dtype=np.uint8) for n in SIZES]
    copier = Copier(threads)
    try:
        assert sum(SIZES) >= PARALLEL_MIN  # the helpers take part
        done = copier.run(_copies(sources, targets), time.monotonic() + 10)
    finally:
        copier.close()
    assert done == [True] * len(SIZES)
    for source, target in zip(sources, targets, strict=True):
        assert np.array_equal(target[: source.nbytes], source)
        assert not target[source.nbytes :].any()


def test_a_copy_whose_deadline_has_passed_starts_no_piece():
    source = np.full(2 * PARALLEL_MIN, 9, dtype=np.uint8)
    target = np.zeros_like(source)
    copier = Copier(2)
    try:
        done = copier.run(_copies([source], [target]), time.monotonic() - 1)
    finally:
        copier.close()
    assert done == [False]
    assert not target.any()


def test_a_batch_of_small_copies_runs_on_the_calling_thread_and_keeps_its_deadline():
    sizes = [0, 1, 4096, 4096, 65535]  # well under PARALLEL_MIN in all
    rng = np.random.default_rng(3)
    sources = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    targets = [np.zeros(n + 8, dtype=np.uint8) for n in sizes]
    copier = Copier(2)
    try:
        assert copier.run(_copies(sources, targets), time.monotonic() + 10) == [True] * 5
        assert copier._helpers is None, "no helper thread was started"
        late = [np.zeros(n, dtype=np.uint8) for n in sizes]
        done = copier.run(_copies(sources, late), time.monotonic() - 1)
    finally:
        copier.close()
    for source, target in zip(sources, targets, strict=True):
        assert np.array_equal(target[: source.nbytes], source)
        assert not target[source.nbytes :].any()
    assert done == [True, False, False, False, False], "only the empty copy needs no time"
    assert not any(t.any() for t in late)


def test_a_copier_needs_a_thread():
    with pytest.raises(ValueError, match="at least one thread"):
        Copier(0)
