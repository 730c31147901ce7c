"""Replays a model check's failing example step by step: ``PYTHONHASHSEED=H .venv/bin/python
scripts/replay_model_example.py PYTEST_OUTPUT [--story KEY]``, H the hash seed the failure
printed (string hashing orders some of the master's loops).

A model test (tests/unit/test_master_model.py, test_master_replication_model.py,
test_master_core_model.py) that fails
prints its example: the rules it ran, in order, each after the values it drew. Hypothesis can
replay a seed, but not always this example: the model's draws depend on the master's
behaviour and, while shrinking, on the order of objects in memory, so a replay may take
another path or report its strategy as flaky. This reads the printed example from the saved
output and calls the same rules with the same values, on the code as it is now: the failure
comes back at its step (or the example passes, once fixed). ``--story KEY`` prints what the
master noted of a key when it fails (``MasterState.story``).

Exits 1 when a step fails, 0 when the whole example passes, 2 when the example does not fit
the code any more (a rule drew more values than the example holds: the code took another
path).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: What pytest puts before each line of an assertion's message, and hypothesis's enum reprs.
_PREFIX = re.compile(r"^E {3,}")
_ENUM = re.compile(r"<(\w+)\.(\w+): [^>]*>")


class _Draws:
    """Stands for hypothesis's ``data``: hands out the example's values in order."""

    def __init__(self, values: list[Any]) -> None:
        self.values = values

    def draw(self, strategy: object, label: str | None = None) -> Any:
        if not self.values:
            raise _OffPath("a rule drew more values than the example holds")
        return self.values.pop(0)


class _OffPath(Exception):
    pass


def example_lines(output: str) -> list[str]:
    """The example's statements (``state...`` and ``Draw N: value``), each whole."""
    lines = output.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if "Failing test case" in line)
    except StopIteration:
        raise SystemExit("no 'Failing test case' in that output") from None
    items: list[str] = []
    for raw in lines[start + 1 :]:
        line = _PREFIX.sub("", raw)
        if line.startswith(("replay with", "You can reproduce", "Explanation")) or (
            raw.startswith("E") is not lines[start].startswith("E")
        ):
            break
        if line.startswith(("state", "Draw")):
            items.append(line)
        elif items:
            items[-1] += "\n" + line
    return items


def replay(items: list[str], story: str | None) -> int:
    sys.path[:0] = [str(ROOT / "tests" / "unit"), str(ROOT / "tests")]
    import hypothesis
    import test_master_core_model
    import test_master_model
    import test_master_replication_model

    hypothesis.event = lambda *args, **kwargs: None  # (outside a test it raises)
    scope: dict[str, Any] = {}
    for module in (test_master_core_model, test_master_replication_model, test_master_model):
        module.event = hypothesis.event  # type: ignore[attr-defined]
        scope.update(vars(module))
    pending: list[Any] = []
    scope["_draws"] = lambda: _Draws(pending)
    rules = [i for i, item in enumerate(items) if item.startswith("state.")]
    last = max((i for i in rules if not items[i].startswith("state.teardown")), default=-1)
    for index, item in enumerate(items):
        item = _ENUM.sub(r"\1.\2", item)
        if item.startswith("Draw"):
            value = item.split(":", 1)[1].split("  #")[0]
            pending.append(eval(value, scope))  # (our own test's printed values)
            continue
        step = item.replace("data=data(...)", "data=_draws()")
        try:
            exec(step, scope)
        except AssertionError as failure:
            print(f"fails at: {step.splitlines()[0]}\n{failure}")
            if story is not None:
                model = scope["state"]
                master = model.core.state if hasattr(model, "core") else model.state
                for event in master.story(story):
                    print(f"  {event.time:10.3f} {event.event} {event.details}")
            return 1
        except _OffPath as off:
            if index == last:  # (its values end where the step failed, once)
                print(f"gets past the check that failed, in: {step.splitlines()[0]}")
                return 0
            print(f"the example no longer fits at: {step.splitlines()[0]} ({off})")
            return 2
        if pending:
            print(f"the example no longer fits at: {step.splitlines()[0]} (values left over)")
            return 2
    print("the example passes")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="a saved pytest output with the example")
    parser.add_argument("--story", metavar="KEY", help="print the master's story of KEY")
    args = parser.parse_args()
    return replay(example_lines(args.output.read_text()), args.story)


if __name__ == "__main__":
    sys.exit(main())
