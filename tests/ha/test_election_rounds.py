"""A master's campaign outlives a failure where a term begins (master/election.py): the
round is logged, leadership given up, and the master campaigns again, rather than sitting a
standby for good with nobody told. Against a real etcd (plain http: the rule is the
election's, not the transport's)."""

from __future__ import annotations

import asyncio

from kvpool.etcd_process import EtcdProcess
from kvpool.master.election import Election


def test_a_term_whose_start_fails_is_given_up_and_the_master_is_elected_again(tmp_path):
    etcd = EtcdProcess(tmp_path / "etcd").start()
    try:
        terms: list[int] = []
        lost: list[bool] = []

        async def scenario() -> None:
            election = Election([etcd.endpoint], "rounds", "127.0.0.1:1", ttl=2)
            stop = asyncio.Event()

            async def on_elected(epoch: int) -> None:
                terms.append(epoch)
                if len(terms) == 1:
                    raise RuntimeError("a bug in the first term's start")
                stop.set()

            async def on_lost() -> None:
                lost.append(True)

            await asyncio.wait_for(election.run(stop, on_elected, on_lost), 60)

        asyncio.run(scenario())
        assert len(terms) == 2, "elected again after the failed start"
        assert terms[1] > terms[0]
        assert lost, "the failed term was ended"
    finally:
        etcd.close()
