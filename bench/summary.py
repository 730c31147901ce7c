"""The closing of a small bench: its results as a table on the terminal and as a JSON file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table


def print_and_save(
    title: str,
    first_column: str,
    results: dict[str, dict[str, float]],
    json_path: str | Path,
    cell: Callable[[float], str] = "{:,}".format,
    unit: str = "",
) -> None:
    """``results``: row name -> column name -> value (every row with the same columns);
    ``unit`` follows each column's name in the table (not in the file)."""
    table = Table(title=title)
    table.add_column(first_column)
    for column in next(iter(results.values())):
        table.add_column(f"{column} ({unit})" if unit else column, justify="right")
    for name, row in results.items():
        table.add_row(name, *(cell(value) for value in row.values()))
    Console().print(table)
    path = Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")
