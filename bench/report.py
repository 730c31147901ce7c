"""The results of ``kvpool bench --compare``: a table, a JSON file, a plot, the docs' copy.

The results dict (what compare.compare returns and compare.json holds)::

    environment, mooncake_version, systems, security, security_of, skipped, runs, store_size,
    workloads, targets,
    placements: {name: {description, seconds, other_processes,
                        values:  {workload: {metric: {system: [one value per run]}}},
                        medians: {workload: {metric: {system: median}}}}}

A workload with calls in flight (``inflight``) also has, per placement,
``inflight: {workload: {metric: {system: {best, medians: {way: median}}}}}``: each way of
issuing the calls ("threads x8", "asyncio x16") and the best, whose runs are the system's
values; ``inflight_rows()`` sets them beside the one-batch-at-a-time figures of ``32x4KiB``.

Metrics are put, get (GB/s, or objects/s for small objects) and exists (keys/s).
``security`` is what ``--security`` asked (secure, insecure, both) and ``security_of`` says
of each kvpool system whether it ran secure (TLS and tokens) or ``--insecure``: with
``both``, "kvpool" is the secure one and "kvpool-insecure" the other, and the written files
add ``security_rows`` (``security_rows()``: the two side by side, per workload). Results
written before kvpool was secure by default have neither (their kvpool ran insecure).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
NAMES = {"kvpool": "kvpool", "mooncake": "Mooncake", "memcpy": "memcpy"}
START, END = "<!-- compare:start -->", "<!-- compare:end -->"
COMMAND = "bash bench/setup_mooncake.sh && .venv/bin/kvpool bench --compare --update-docs"
#: The docs' secure-vs-insecure table, refreshed between these markers when the page has them.
SECURITY_START, SECURITY_END = "<!-- security:start -->", "<!-- security:end -->"
SECURE, INSECURE = "kvpool", "kvpool-insecure"
#: A secure kvpool should stay within this fraction of an insecure one on every workload.
SECURITY_TOLERANCE = 0.10


def rows(results: dict) -> list[dict]:
    """One row per placement, workload and metric, with medians, ratios and targets."""
    workloads = {w["name"]: w for w in results["workloads"]}
    out = []
    for placement, measured in results["placements"].items():
        for name, by_metric in measured["medians"].items():
            for metric, medians in by_metric.items():
                kv = medians.get("kvpool")
                targets = []
                for t in results["targets"]:
                    if (t["placement"], t["workload"], t["metric"]) != (placement, name, metric):
                        continue
                    other = medians.get(t["versus"])
                    met = None if kv is None or other is None else kv >= t["factor"] * other
                    targets.append({**t, "met": met})
                out.append(
                    {
                        "placement": placement,
                        "workload": name,
                        "title": workloads[name]["title"],
                        "metric": metric,
                        "unit": workloads[name]["unit"],
                        "medians": medians,
                        "vs_mooncake": _ratio(kv, medians.get("mooncake")),
                        "vs_memcpy": _ratio(kv, medians.get("memcpy")),
                        "kvpool_security": results.get("security_of", {}).get("kvpool"),
                        "targets": targets,
                    }
                )
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def security_rows(results: dict) -> list[dict]:
    """Where a secure and an insecure kvpool both ran (``--security both``): one row per
    placement, workload and metric with both medians, the secure one's difference from the
    insecure one (``change``: +0.05 is 5 % faster; every metric is a rate) and the median of
    the runs' own differences (``paired``: each run measured the two back to back)."""
    workloads = {w["name"]: w for w in results["workloads"]}
    out = []
    for placement, measured in results["placements"].items():
        for name, by_metric in measured["medians"].items():
            for metric, medians in by_metric.items():
                secure, insecure = medians.get(SECURE), medians.get(INSECURE)
                if secure is None or insecure is None:
                    continue
                runs = measured["values"][name][metric]
                changes = [
                    s / i - 1 for s, i in zip(runs[SECURE], runs[INSECURE], strict=False) if i
                ]
                change = _ratio(secure, insecure)
                change = None if change is None else change - 1
                out.append(
                    {
                        "placement": placement,
                        "workload": name,
                        "title": workloads[name]["title"],
                        "metric": metric,
                        "unit": workloads[name]["unit"],
                        "secure": secure,
                        "insecure": insecure,
                        "change": change,
                        "paired": statistics.median(changes) if changes else None,
                        "within": None if change is None else change >= -SECURITY_TOLERANCE,
                    }
                )
    return out


#: The one-call-at-a-time workload that the calls-in-flight rows are set beside.
SINGLE_BATCH = "32x4KiB"


def inflight_rows(results: dict) -> list[dict]:
    """Per placement, workload with calls in flight and metric: each system's best way and
    its median, kvpool's ratio to Mooncake, and the single-batch figures of ``SINGLE_BATCH``
    (objects/s and microseconds per 32-key call) when that workload ran too."""
    workloads = {w["name"]: w for w in results["workloads"]}
    out = []
    for placement, measured in results["placements"].items():
        for name, by_metric in measured.get("inflight", {}).items():
            for metric, by_system in by_metric.items():
                medians = measured["medians"][name][metric]
                single = measured["medians"].get(SINGLE_BATCH, {}).get(metric, {})
                batch = workloads.get(SINGLE_BATCH, {}).get("batch", 32)
                out.append(
                    {
                        "placement": placement,
                        "workload": name,
                        "metric": metric,
                        "best": {s: v["best"] for s, v in by_system.items()},
                        "ways": {s: v["medians"] for s, v in by_system.items()},
                        "medians": medians,
                        "vs_mooncake": _ratio(medians.get("kvpool"), medians.get("mooncake")),
                        "single": single,
                        "single_us": {s: batch / v * 1e6 for s, v in single.items() if v},
                    }
                )
    return out


INFLIGHT_HEADERS = [
    "placement", "op", "kvpool objects/s (best way)", "Mooncake objects/s (best way)",
    "kvpool/Mooncake", "one batch at a time: kvpool, Mooncake (objects/s; us per call)",
]  # fmt: skip


def _inflight_cells(row: dict) -> list[str]:
    def best(system: str) -> str:
        value = row["medians"].get(system)
        return "-" if value is None else f"{value:,.0f} ({row['best'][system]})"

    def single(system: str) -> str:
        value = row["single"].get(system)
        return "-" if value is None else f"{value:,.0f}; {row['single_us'][system]:,.0f} us"

    return [
        row["placement"],
        row["metric"],
        best("kvpool"),
        best("mooncake"),
        _times(row["vs_mooncake"]),
        f"{single('kvpool')} / {single('mooncake')}",
    ]


def inflight_markdown(results: dict) -> str:
    """The calls-in-flight table in Markdown, every way's median below it; empty without."""
    found = inflight_rows(results)
    if not found:
        return ""
    lines = [
        "| " + " | ".join(INFLIGHT_HEADERS) + " |",
        "|" + "|".join("---" for _ in INFLIGHT_HEADERS) + "|",
        *("| " + " | ".join(_inflight_cells(row)) + " |" for row in found),
        "",
    ]
    for row in found:
        for system, ways in row["ways"].items():
            text = ", ".join(f"{way} {value:,.0f}" for way, value in ways.items())
            lines.append(
                f"- {row['placement']} {row['metric']} {NAMES.get(system, system)}: {text}"
            )
    return "\n".join(lines)


def _percent(change: float | None) -> str:
    return "-" if change is None else f"{change:+.1%}"


SECURITY_HEADERS = [
    "placement", "workload", "op", "unit", "secure", "insecure", "secure vs insecure",
    "per run (median)", "within 10 %",
]  # fmt: skip


def _security_cells(row: dict, short: bool = False) -> list[str]:
    return [
        row["placement"],
        row["workload"] if short else row["title"],
        row["metric"],
        row["unit"],
        _value(row["secure"], row["unit"]),
        _value(row["insecure"], row["unit"]),
        _percent(row["change"]),
        _percent(row["paired"]),
        {True: "yes", False: "NO", None: "n/a"}[row["within"]],
    ]


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if unit == "GB/s" else f"{value:,.0f}"


def _times(ratio: float | None, digits: int = 2) -> str:
    return "-" if ratio is None else f"{ratio:.{digits}f}x"


def _target_text(targets: list[dict]) -> str:
    words = {True: "met", False: "MISSED", None: "n/a"}
    return "; ".join(f"{NAMES[t['versus']]} x{t['factor']:g}: {words[t['met']]}" for t in targets)


def _cells(row: dict, short: bool = False) -> list[str]:
    return [
        row["placement"],
        row["workload"] if short else row["title"],
        row["metric"],
        row["unit"],
        *(_value(row["medians"].get(s), row["unit"]) for s in NAMES),
        _times(row["vs_mooncake"]),
        _times(row["vs_memcpy"], 3),
        _target_text(row["targets"]),
    ]


HEADERS = [
    "placement", "workload", "op", "unit", "kvpool", "Mooncake", "memcpy",
    "kvpool/Mooncake", "kvpool/memcpy", "target",
]  # fmt: skip


def print_table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kvpool vs Mooncake Store vs memcpy: medians of {results['runs']} runs")
    for header in HEADERS:
        table.add_column(header, justify="left" if header in ("workload", "target") else "right")
    for row in rows(results):
        table.add_row(*_cells(row, short=True))
    console = Console(width=max(Console().width, 150))
    if (security := results.get("security_of", {}).get("kvpool")) is not None:
        table.caption = f"kvpool: {_security_words(security)}"
    console.print(table)
    if compared := security_rows(results):
        table = Table(
            title=f"kvpool secure (TLS, tokens) vs --insecure: medians of {results['runs']} "
            "alternating runs"
        )
        for header in SECURITY_HEADERS:
            table.add_column(header, justify="left" if header == "workload" else "right")
        for row in compared:
            table.add_row(*_security_cells(row, short=True))
        console.print(table)
    if found := inflight_rows(results):
        table = Table(title="Calls in flight from one client process: best way of each system")
        for header in INFLIGHT_HEADERS:
            table.add_column(header, justify="right")
        for row in found:
            table.add_row(*_inflight_cells(row))
        console.print(table)
        console.print(inflight_markdown(results).split("\n\n", 1)[-1], markup=False)
    for name, why in results["skipped"].items():
        console.print(f"skipped {name}: {why}", markup=False)
    for placement, values in results.get("ceilings", {}).items():
        text = ", ".join(f"{what} {value:.2f}" for what, value in values.items())
        console.print(f"[{placement}] ceilings: {text}", markup=False)
    for placement, measured in results["placements"].items():
        busy = ", ".join(
            f"{p['command'][:60]} ({p['cpu']:.0%})" for p in measured["other_processes"][:4]
        )
        console.print(
            f"[{placement}] other processes busy meanwhile: {busy or 'none'}", markup=False
        )


def _security_words(security: str) -> str:
    return "secure (TLS, tokens)" if security == "secure" else "--insecure"


def markdown(results: dict) -> str:
    env = results["environment"]
    security = results.get("security_of", {}).get("kvpool")
    lines = [
        f"Measured {env['date']} on {env['cpus']} cores ({env['cpu_model']}), kernel "
        f"{env['kernel']}, kvpool {env['kvpool_commit']}"
        f"{' plus uncommitted changes' if env['kvpool_changes'] else ''}"
        f"{f' ({_security_words(security)})' if security else ''}, Mooncake "
        f"{results['mooncake_version']}; medians of {results['runs']} alternating runs, "
        f"{results['seconds']:.0f} s in all.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "|".join("---" for _ in HEADERS) + "|",
    ]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows(results)]
    lines.append("")
    if results.get("ceilings"):
        lines += _ceilings_markdown(results["ceilings"])
    for placement, measured in results["placements"].items():
        busy = ", ".join(
            f"`{p['command'][:50]}` ({p['cpu']:.0%} of a core)"
            for p in measured["other_processes"][:3]
        )
        lines.append(
            f"- {placement}: {measured['description']}; other processes busy meanwhile: "
            f"{busy or 'none'}."
        )
    return "\n".join(lines)


def security_markdown(results: dict) -> str:
    """The secure-vs-insecure table (``--security both``) in Markdown; empty without one."""
    compared = security_rows(results)
    if not compared:
        return ""
    lines = [
        f"kvpool secure (TLS on the master's gRPC port and lane, tokens) vs `--insecure`, "
        f"medians of {results['runs']} runs that measured the two back to back, alternating "
        f"which went first:",
        "",
        "| " + " | ".join(SECURITY_HEADERS) + " |",
        "|" + "|".join("---" for _ in SECURITY_HEADERS) + "|",
    ]
    lines += ["| " + " | ".join(_security_cells(row)) + " |" for row in compared]
    return "\n".join(lines)


def _ceilings_markdown(ceilings: dict) -> list[str]:
    names = list(ceilings)
    lines = [
        "Beneath any store, between two bare processes in the same placements (bench/ceilings.py):",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for what in ceilings[names[0]]:
        unit = "" if "(us)" in what else " GB/s"
        cells = [f"{ceilings[n].get(what, float('nan')):.2f}{unit}" for n in names]
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def write_all(results: dict, json_path: Path, png_path: Path, *, docs: bool = False) -> None:
    from bench import plot

    json_path.parent.mkdir(parents=True, exist_ok=True)
    results = {**results, "rows": rows(results)}
    if found := inflight_rows(results):
        results["inflight_rows"] = found
    if compared := security_rows(results):
        results["security_rows"] = compared
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {json_path}")
    drawn = plot.draw(results, png_path)
    if drawn:
        print(f"wrote {png_path}")
    if docs:
        (DOCS / "benchmarks.json").write_text(json.dumps(results, indent=1) + "\n")
        if drawn:
            plot.draw(results, DOCS / "benchmarks.png")
        _update_markdown(DOCS / "benchmarks.md", markdown(results))
        print(f"updated {DOCS / 'benchmarks.md'}, benchmarks.json, benchmarks.png")
        if compared:
            _update_security_block(DOCS / "benchmarks.md", security_markdown(results))


def _update_markdown(path: Path, table: str) -> None:
    block = f"{START}\n{table}\n{END}"
    if path.exists() and START in (text := path.read_text()):
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = f"# Benchmarks\n\n```bash\n{COMMAND}\n```\n\n{block}\n"
    path.write_text(text)


def _update_security_block(path: Path, table: str) -> None:
    """Refreshes the secure-vs-insecure table between its markers when the page has them;
    else prints it (the page's prose decides where it goes: add the markers there)."""
    text = path.read_text() if path.exists() else ""
    if SECURITY_START not in text:
        print(
            f"secure vs insecure (in docs/benchmarks.json; add {SECURITY_START} "
            f"{SECURITY_END} to {path.name} to keep this there):\n\n{table}\n"
        )
        return
    block = f"{SECURITY_START}\n{table}\n{SECURITY_END}"
    pattern = re.escape(SECURITY_START) + ".*?" + re.escape(SECURITY_END)
    path.write_text(re.sub(pattern, lambda _: block, text, flags=re.S))
    print(f"updated the secure-vs-insecure table in {path}")
