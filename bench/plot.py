"""The comparison's picture: throughput against object size, one panel per placement.

Single-client transfer workloads only (4 KiB batches count as 4 KiB objects, their objects/s
turned into GB/s). matplotlib is a bench-time install (bench/setup_mooncake.sh), not a kvpool
dependency: without it ``draw`` says so and returns False.
"""

from __future__ import annotations

import sys
from pathlib import Path

STYLE = {
    "kvpool": "tab:blue",
    "kvpool-insecure": "tab:cyan",
    "mooncake": "tab:orange",
    "memcpy": "tab:gray",
}
LABEL = {
    "kvpool": "kvpool",
    "kvpool-insecure": "kvpool --insecure",
    "mooncake": "Mooncake Store",
    "memcpy": "memcpy",
}


def _label(results: dict, system: str) -> str:
    """The legend's name of ``system``; kvpool says whether it ran secure when both ran."""
    if system == "kvpool" and len(results.get("security_of", {})) > 1:
        return "kvpool (TLS, tokens)"
    return LABEL.get(system, system)


def series(results: dict, placement: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(system, metric) -> [(object size, GB/s)] sorted by size."""
    medians = results["placements"][placement]["medians"]
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for workload in results["workloads"]:
        if workload["clients"] != 1 or workload["exists_batch"]:
            continue
        for metric in ("put", "get"):
            for system, value in medians.get(workload["name"], {}).get(metric, {}).items():
                gbps = value if workload["unit"] == "GB/s" else value * workload["size"] / 1e9
                out.setdefault((system, metric), []).append((workload["size"], gbps))
    return {key: sorted(points) for key, points in out.items()}


def _ticks(results: dict) -> dict[int, str]:
    """Object size -> its axis label, e.g. "1 MiB x32" for a batched workload."""
    ticks = {}
    for w in results["workloads"]:
        if w["clients"] == 1 and not w["exists_batch"]:
            size = w["size"]
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            ticks[size] = label + (f" x{w['batch']}" if w["batch"] > 1 else "")
    return ticks


def draw(results: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "no plot: matplotlib is missing (bench/setup_mooncake.sh installs it)", file=sys.stderr
        )
        return False
    placements = list(results["placements"])
    if not placements:
        return False
    fig, axes = plt.subplots(
        1, len(placements), figsize=(6.5 * len(placements), 4.8), squeeze=False, sharey=True
    )
    for ax, placement in zip(axes[0], placements, strict=True):
        for (system, metric), points in sorted(series(results, placement).items()):
            sizes, values = zip(*points, strict=True)
            ax.plot(
                sizes,
                values,
                marker="o" if metric == "put" else "s",
                linestyle="-" if metric == "put" else "--",
                color=STYLE.get(system, "black"),
                label=f"{_label(results, system)} {metric}",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = _ticks(results)
        ax.set_xticks(list(ticks), list(ticks.values()))
        ax.minorticks_off()
        ax.set_xlabel("object size (batches of 32 where marked x32)")
        ax.set_title(results["placements"][placement]["description"], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("GB/s (median)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(
        f"kvpool vs Mooncake Store vs memcpy, medians of {results['runs']} runs "
        f"({results['environment']['cpus']} cores, {results['environment']['date'][:10]})"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
