"""The master's configuration refuses what its storage nodes would refuse later."""

from __future__ import annotations

import pytest

from kvpool.master.config import MasterConfig


@pytest.mark.parametrize("name", ["write_timeout", "max_lease_ttl"])
def test_grants_may_not_outlive_what_nodes_keep_their_seals_for(name):
    """A storage node refuses capabilities that expire further ahead than it keeps their
    seals: a write timeout of an hour made every put over the checked stream fail."""
    from kvpool.master.config import MAX_GRANT_SECONDS
    from kvpool.storage_node.checked_seals import SEAL_LIFE

    assert MAX_GRANT_SECONDS + 60 < SEAL_LIFE, "a margin for clocks and transfers"
    MasterConfig(**{name: MAX_GRANT_SECONDS})
    with pytest.raises(ValueError, match=f"{name} must be at most"):
        MasterConfig(**{name: MAX_GRANT_SECONDS + 1})
