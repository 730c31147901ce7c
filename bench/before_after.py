"""The table of bench/before_after.sh: per workload, the medians of each side's runs, their
change, and the median of the paired changes (round by round, each pair measured back to back).

    python -m bench.before_after DIR
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

Key = tuple[str, str, str]


def _load(folder: Path, side: str) -> tuple[dict[int, dict[Key, float]], dict[Key, str]]:
    figures: dict[int, dict[Key, float]] = {}
    units: dict[Key, str] = {}
    for path in folder.glob(f"{side}-*.json"):
        match = re.search(r"-(\d+)\.json$", path.name)
        if match is None:
            continue
        rows = json.loads(path.read_text())["rows"]
        figures[int(match.group(1))] = {
            (r["placement"], r["workload"], r["metric"]): r["medians"]["kvpool"]
            for r in rows
            if r["medians"].get("kvpool")
        }
        units.update({(r["placement"], r["workload"], r["metric"]): r["unit"] for r in rows})
    return figures, units


def table(folder: Path, within: float = 0.10) -> str:
    before, units = _load(folder, "before")
    after, _ = _load(folder, "after")
    rounds = sorted(set(before) & set(after))
    if not rounds:
        raise SystemExit(f"no round with both sides in {folder}")
    lines = [
        f"| placement | workload | op | unit | before | after | change of medians "
        f"| median of {len(rounds)} paired changes | within {within:.0%} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in before[rounds[0]]:
        b = statistics.median(before[i][key] for i in rounds)
        a = statistics.median(after[i][key] for i in rounds)
        paired = statistics.median(after[i][key] / before[i][key] - 1 for i in rounds)
        ok = abs(a / b - 1) <= within or abs(paired) <= within
        shown = "{:,.0f}" if units[key] in ("ops/s", "keys/s") else "{:.2f}"
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {units[key]} | {shown.format(b)} "
            f"| {shown.format(a)} | {a / b - 1:+.1%} | {paired:+.1%} | {'yes' if ok else 'NO'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
