"""Generated command lines for ``kvpool master`` and ``kvpool node``, read the way ``kvpool``
reads them (in this process: the parser, then the checks a service makes before it
serves).

A command line is accepted, or refused with exit code 2 and a message that says why, never
a traceback: argparse's own refusals, a number out of range (common/cli_numbers.py), flags
that do not fit together.
"""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest
from fuzzing import Figures, fuzz_settings, share
from hypothesis import event, given
from hypothesis import strategies as st

from kvpool.cli.main import build_parser
from kvpool.common.master_address import parse_master
from kvpool.master import main as master_main
from kvpool.storage_node import main as node_main

SURFACE = "cli"
pytestmark = pytest.mark.fuzz
SETTINGS = fuzz_settings(share(1))

PARSERS = {command: build_parser(command) for command in ("master", "node")}


def flags_of(module) -> list[str]:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return sorted({flag for action in parser._actions for flag in action.option_strings})


FLAGS = {"master": flags_of(master_main), "node": flags_of(node_main)}
FLAG_NAMES = sorted(set(FLAGS["master"]) | set(FLAGS["node"]) - {"-h", "--help"})

numbers = st.sampled_from(
    ["0", "1", "-1", "nan", "-nan", "inf", "-inf", "1e300", "1e-300", "0x10", "1_000", "١٢",
     "4294967296", "9" * 5000, "2.5", " 3 ", "", " ", "0.0", "-0"]
)  # fmt: skip
sizes = st.sampled_from(
    ["1GiB", "256MiB", "1.5GiB", "0B", "-1GiB", "1e3MiB", "nanGiB", "infKiB", "1 GiB", "1TB",
     "128PiB", "10ZiB", "1gib", "GiB", "0x10MiB", "1.0000000000000001KiB"]
)  # fmt: skip
addresses = st.sampled_from(
    ["127.0.0.1:1", "etcd://h:2379/c", "etcd://", "h:0", "h:65536", "[::1]:5", "::1", ":",
     "a,b", "127.0.0.1:1,", "http://x:1", "h:-1", "h:p"]
)  # fmt: skip
text = st.text(st.characters(exclude_characters="\0"), max_size=12)
surrogates = st.binary(min_size=1, max_size=6).map(lambda b: b.decode("utf-8", "surrogateescape"))
values = st.one_of(numbers, sizes, addresses, text, surrogates)
flags = st.one_of(
    st.sampled_from(FLAG_NAMES),
    st.sampled_from(FLAG_NAMES).map(lambda f: f[: max(3, len(f) // 2)]),  # abbreviated
    st.sampled_from(FLAG_NAMES).flatmap(lambda f: values.map(lambda v: f"{f}={v}")),
)
argvs = st.lists(st.one_of(flags, values, st.tuples(flags, values).map(list)), max_size=8).map(
    lambda words: [w for word in words for w in (word if isinstance(word, list) else [word])]
)


@pytest.fixture(scope="module")
def figures():
    figures = Figures(SURFACE)
    yield figures
    figures.publish()


def outcome(command: str, argv: list[str]) -> tuple[int, str]:
    """The exit code ``kvpool COMMAND ARGV...`` would end with before serving (0: it would
    serve), and what it said."""
    parser = PARSERS[command]
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
        try:
            args, rest = parser.parse_known_args([command, *argv])
            if rest:
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
        except SystemExit as exit:
            return int(exit.code or 0), said.getvalue()
    try:
        if command == "master":
            master_main.config_from_args(args)
        else:
            parse_master(args.master)
            problem = node_main._storage_problem(args)
            if problem:
                return 2, problem
            node_main.node_id_of(args)
    except ValueError as error:
        return 2, str(error)
    return 0, ""


@SETTINGS
@given(command=st.sampled_from(["master", "node"]), argv=argvs)
def test_generated_command_lines_are_accepted_or_refused_with_a_message(figures, command, argv):
    code, said = outcome(command, argv)
    event(f"{command}: exit {code}")
    assert "Traceback" not in said, said
    if code == 2:
        assert said.strip(), "refused without a word"
    else:
        assert code == 0, said
    figures.cases += 1
