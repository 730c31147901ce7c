"""The legal changes of an object's state, in one table.

An object is created RESERVED (a put) or PUBLISHED (adopted from what a node reports), moves
forward through the life cycle drawn in ``state.py``, and may end (``GONE``) from any state.
Nothing ever goes back: a published object is never written again, a committed one never
reserved again. ``MasterState`` changes a record's state, creates and deletes records only
through one method that checks this table, so a rule broken by a later change fails loudly
where it happens instead of surfacing as a corrupted index much later.
"""

from __future__ import annotations

from kvpool.master.records import ObjectState

#: No object under the key: before it is created, and after it ended (revoked, reclaimed,
#: removed, evicted, lost...).
GONE = None

#: The states by plain names: reading an Enum member off its class is slow on Python 3.11, and
#: every put changes state three times.
RESERVED, COMMITTED, PUBLISHED = ObjectState.RESERVED, ObjectState.COMMITTED, ObjectState.PUBLISHED

#: from -> the states it may go to.
LEGAL: dict[ObjectState | None, frozenset[ObjectState | None]] = {
    GONE: frozenset({RESERVED, PUBLISHED}),  # put_start; adoption of a node's report
    RESERVED: frozenset({COMMITTED, GONE}),  # put_end; revoke, timeout, loss, nothing written
    COMMITTED: frozenset({PUBLISHED, GONE}),  # nodes recorded it; none did, loss, forced removal
    PUBLISHED: frozenset({GONE}),  # removal, eviction, loss, superseded by a newer write
}


#: LEGAL keyed by the id of the state, each to a tuple: an Enum member hashes in Python code,
#: an int in C, and a tuple finds a member by identity; the check runs on every put.
LEGAL_BY_ID: dict[int, tuple[ObjectState | None, ...]] = {
    id(before): tuple(after) for before, after in LEGAL.items()
}


def name(state: ObjectState | None) -> str:
    return "gone" if state is None else state.value


class IllegalTransition(AssertionError):
    """A change of an object's state that the table does not allow: a bug in the master."""

    def __init__(
        self,
        key: str,
        from_state: ObjectState | None,
        to_state: ObjectState | None,
        why: str = "",
    ) -> None:
        self.key = key
        self.from_state = from_state
        self.to_state = to_state
        if not why:
            allowed = ", ".join(sorted(name(s) for s in LEGAL[from_state]))
            why = f"from {name(from_state)} only to: {allowed}"
        super().__init__(
            f"illegal transition of object {key!r}: {name(from_state)} -> {name(to_state)} ({why})"
        )
