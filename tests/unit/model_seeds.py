"""How the model checks of the master's core (test_master_model.py,
test_master_replication_model.py, test_master_core_model.py) pick and report their seeds.

Each run draws a fresh seed, so that runs together check more sequences than one run does;
``KVPOOL_MODEL_SEED`` replays one. A failure carries the seed (and the hash seed: string
hashing orders some of the master's loops) in a note.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

from hypothesis import Phase, seed, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

#: Seeds the examples: set it to replay a run (its seed is printed when it fails).
SEED_VARIABLE = "KVPOOL_MODEL_SEED"


def run_seeded(model: Callable[[], RuleBasedStateMachine], base: settings) -> None:
    """Runs ``model`` as a test under ``base``, with the chosen or a fresh seed."""
    chosen = os.environ.get(SEED_VARIABLE, "").strip()
    value = int(chosen) if chosen else random.SystemRandom().randrange(2**32)

    @seed(value)
    def machine() -> RuleBasedStateMachine:
        return model()

    # A run with a fresh seed (CI) reports a failure as found, with its seed: shrinking a
    # long example can take minutes, past the test's timeout, which would hide the failure
    # behind a timeout. A replay (the seed given) shrinks it.
    phases = base.phases if chosen else [Phase.explicit, Phase.generate]
    try:
        run_state_machine_as_test(machine, settings=settings(base, phases=phases))
    except BaseException as failure:
        hashing = os.environ.get("PYTHONHASHSEED", "")
        if hashing:
            failure.add_note(f"replay with PYTHONHASHSEED={hashing} {SEED_VARIABLE}={value}")
        else:
            failure.add_note(
                f"replay with {SEED_VARIABLE}={value} (PYTHONHASHSEED was unset: a replay may "
                "need a few hash seeds; scripts/test.sh sets and prints one)"
            )
        raise
