"""A master's campaign outlives a failure where a term begins (master/election.py): the
round is logged, leadership given up, and the master campaigns again, rather than sitting a
standby for good with nobody told. Against a real etcd (plain http: the rule is the
election's, not the transport's)."""

from __future__ import annotations

import asyncio
import shutil

from kvpool.etcd_process import EtcdProcess
from kvpool.master.election import Election


def lose_everything(etcd: EtcdProcess) -> None:
    """etcd restarted without its data directory (on the same ports)."""
    etcd.stop()
    shutil.rmtree(etcd.data_dir)
    etcd.start()


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


def test_a_term_after_etcd_lost_its_data_knows_it_and_leads_with_a_higher_epoch(tmp_path):
    """etcd restarted without its data directory (or restored from an older backup): its
    revisions start again, so an epoch read from them could be lower than the last term's,
    and the node list and tombstone records are gone. The next term is told (it then waits
    for whatever nodes come, as a first start does: master/main.py), and its epoch is still
    above every earlier one."""
    etcd = EtcdProcess(tmp_path / "etcd").start()
    try:
        terms: list[tuple[int, bool]] = []

        async def scenario() -> None:
            election = Election([etcd.endpoint], "wiped", "127.0.0.1:1", ttl=2)
            stop = asyncio.Event()

            async def on_elected(epoch: int) -> None:
                terms.append((epoch, election.etcd_data_lost))
                if len(terms) == 1:
                    await asyncio.to_thread(lose_everything, etcd)
                elif len(terms) == 2:
                    raise RuntimeError("(ends the term: the next one finds nothing lost)")
                else:
                    stop.set()

            async def on_lost() -> None:
                pass

            await asyncio.wait_for(election.run(stop, on_elected, on_lost), 60)

        asyncio.run(scenario())
        (first, first_lost), (second, second_lost), (third, third_lost) = terms
        assert not first_lost, "the cluster's first term: nothing was lost"
        assert second_lost, "the term after the loss is told of it"
        assert not third_lost, "one loss, told once"
        assert first < second < third
    finally:
        etcd.close()


def test_a_term_whose_start_takes_longer_than_the_lease_keeps_it(tmp_path):
    """A new term reads etcd before it begins (its node list, its tombstone records), which
    can take longer than the lease TTL. (The lease was first renewed only once the start was
    over: a start of over about two thirds of the TTL lost the term to a standby, and one
    that always did so kept every master from leading.)"""
    etcd = EtcdProcess(tmp_path / "etcd").start()
    try:
        elected: list[str] = []
        serving_after_start: list[bool] = []

        async def scenario() -> None:
            stop = asyncio.Event()
            first = Election([etcd.endpoint], "slow", "127.0.0.1:1", ttl=2)
            standby = Election([etcd.endpoint], "slow", "127.0.0.1:2", ttl=2)

            def elected_as(name: str, election: Election):
                async def on_elected(epoch: int) -> None:
                    elected.append(name)
                    if name == "first":
                        await asyncio.sleep(6)  # (three TTLs of reading etcd)
                        serving_after_start.append(election.serving())
                        await asyncio.sleep(1)
                        stop.set()

                return on_elected

            async def on_lost() -> None:
                pass

            campaigns = [
                asyncio.ensure_future(first.run(stop, elected_as("first", first), on_lost))
            ]
            while not elected:
                await asyncio.sleep(0.05)
            campaigns.append(
                asyncio.ensure_future(standby.run(stop, elected_as("standby", standby), on_lost))
            )
            await asyncio.wait_for(asyncio.gather(*campaigns), 60)

        asyncio.run(scenario())
        assert elected == ["first"], "the standby took the term while it started"
        assert serving_after_start == [True]
    finally:
        etcd.close()


def test_a_standby_that_saw_the_cluster_before_etcd_lost_its_data_is_told_when_it_leads(
    tmp_path,
):
    """(Only a master that had led knew the cluster's marker: a standby elected after the
    loss, the likely one with several masters, was not told.)"""
    etcd = EtcdProcess(tmp_path / "etcd").start()
    try:
        terms: list[tuple[str, bool]] = []

        async def scenario() -> None:
            leader = Election([etcd.endpoint], "standby", "127.0.0.1:1", ttl=2)
            standby = Election([etcd.endpoint], "standby", "127.0.0.1:2", ttl=2)
            stop_leader, stop_standby = asyncio.Event(), asyncio.Event()

            def elected_as(name: str, election: Election, stop: asyncio.Event):
                async def on_elected(epoch: int) -> None:
                    terms.append((name, election.etcd_data_lost))
                    if name == "standby":
                        stop.set()

                return on_elected

            async def on_lost() -> None:
                pass

            leading = asyncio.ensure_future(
                leader.run(stop_leader, elected_as("leader", leader, stop_leader), on_lost)
            )
            while not terms:
                await asyncio.sleep(0.05)
            following = asyncio.ensure_future(
                standby.run(stop_standby, elected_as("standby", standby, stop_standby), on_lost)
            )
            await asyncio.sleep(2)  # (the standby follows, and reads the marker)
            stop_leader.set()
            await leading
            await asyncio.to_thread(lose_everything, etcd)
            await asyncio.wait_for(following, 30)

        asyncio.run(scenario())
        assert terms == [("leader", False), ("standby", True)]
    finally:
        etcd.close()
