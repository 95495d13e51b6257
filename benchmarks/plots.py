"""PNG plots of the benchmark JSON files (matplotlib, Agg backend, dpi 100).

``python -m benchmarks`` calls ``make_plots`` after the runs; ``python -m benchmarks
--plots-only`` redraws them from the JSON files already in the results folder.
"""

from __future__ import annotations

import json
import os

import common  # benchmarks/common.py

DPI = 100
CLIP = 3.0  # the eager ratio axis stops here (outliers are counted, not drawn)
COLORS = {
    "python": "0.35",
    "torchcond": "tab:blue",
    "torchcond.switch": "tab:cyan",
    "torch.cond": "tab:red",
    "torch.where": "tab:orange",
    "select": "tab:blue",
    "select, 0-d pred": "tab:cyan",
    "copy_": "0.45",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8})
    return plt


def _subtitle(fig, data: dict) -> None:
    h = data["header"]
    load = "/".join(str(v) for v in h.get("load_before", [])[:1] + h.get("load_after", [])[:1])
    fig.text(
        0.5,
        0.005,
        f"{h['commit']}, torch {h['torch']}, {h['cpu']}, {h['torch_threads']} threads, "
        f"{h['mode']} run {h['date_utc'][:10]}, load avg before/after {load}",
        ha="center",
        va="bottom",
        fontsize=7,
        color="0.3",
    )


def _save(fig, path: str) -> str:
    fig.savefig(path, dpi=DPI)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


# --- eager --------------------------------------------------------------------------------


def eager_ratio(ax, data: dict, ops=(1, 8)) -> None:
    """torchcond.cond / switch time over the Python baseline, against tensor size."""
    sweep = data["results"]["sweep"]
    styles = {1: "-o", 8: "--s"}
    for cand, color in (("torchcond.cond", "tab:blue"), ("torchcond.switch", "tab:green")):
        for k in ops:
            pts = sorted(
                (p["numel"], p["ratio"]) for p in sweep if p["candidate"] == cand and p["ops"] == k
            )
            if pts:
                xs, ys = zip(*pts)
                what = "cond vs Python if" if cand.endswith("cond") else "switch vs list index"
                ax.plot(
                    xs,
                    ys,
                    styles.get(k, "-"),
                    color=color,
                    label=f"{what}, {k} op{'s' if k > 1 else ''}/branch",
                    ms=4,
                )
    ax.axhline(1.0, color="0.3", lw=0.8)
    target = _eager_target(data)
    ax.axhline(target, color="tab:red", lw=0.8, ls=":", label=f"target: {target:g}x")
    ratios = [p["ratio"] for p in sweep if p["candidate"].startswith("torchcond")]
    top = max(2.0, min(max(ratios, default=1.0) * 1.1, CLIP))
    ax.set_ylim(0, top)
    above = sum(r > top for r in ratios)
    if above:  # a loaded machine: say so rather than squash the rest of the plot
        ax.text(
            0.02,
            0.97,
            f"{above} point(s) above {top:.1f}x not shown",
            transform=ax.transAxes,
            va="top",
            fontsize=7,
            color="tab:red",
        )
    ax.set_xscale("log")
    ax.set_xlabel("elements per tensor (float32)")
    ax.set_ylabel("time per call / Python baseline")
    ax.set_title("torchcond eager overhead (1.0 = Python if)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="best")


def _eager_target(data: dict) -> float:
    """The cond target of the run (its first claim), 1.5 for runs from before it said."""
    for claim in data.get("claims", []):
        if claim["claim"].startswith("torchcond.cond / Python if"):
            value = _target_value(claim["target"].rstrip("x"))
            if value is not None:
                return value
    return 1.5


def every_branch(ax, data: dict) -> None:
    """Part 3: time per call by hand and with torchcond, where every branch runs."""
    rows = data["results"].get("every_branch", [])
    cases = list(dict.fromkeys(r["case"] for r in rows))
    width = 0.38
    for k, case in enumerate(cases):
        row = next(r for r in rows if r["case"] == case and r["candidate"].startswith("torchcond"))
        base, cand = row["baseline"]["best_s"] * 1e6, row["result"]["best_s"] * 1e6
        ax.bar(k - width / 2, base, width, color=COLORS["torch.where"])
        ax.bar(k + width / 2, cand, width, color=COLORS["torchcond"])
        ax.text(
            k + width / 2,
            cand,
            f"{row['ratio']:.2f}x\n+{cand - base:.1f} us",
            ha="center",
            va="bottom",
            fontsize=7,
        )
    claims = [c for c in data.get("claims", []) if c["claim"].startswith(("strategy=", "vmap"))]
    verdicts = "; ".join(
        f"{'meets' if c['meets'] else 'MISSES'} {c['target'].strip()}"
        + (" us over" if c["claim"].startswith("strategy=") else "")
        for c in claims
    )
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases)
    ax.set_ylabel("us per call (fastest block)")
    ax.set_title("every branch runs (no_grad): by hand vs torchcond", fontsize=9)
    from matplotlib.patches import Patch

    handles = [
        Patch(color=COLORS["torch.where"], label="torch.where by hand"),
        Patch(color=COLORS["torchcond"], label=f"torchcond ({verdicts})"),
    ]
    ax.margins(y=0.25)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(handles=handles, loc="upper left", fontsize=7)


def eager_vs_torch_cond(ax, data: dict) -> None:
    sweep = data["results"]["sweep"]
    for cand, label in (
        ("torch.cond", "torch.cond"),
        ("torchcond.cond", "torchcond.cond"),
    ):
        pts = sorted(
            (p["numel"], p["ratio"]) for p in sweep if p["candidate"] == cand and p["ops"] == 1
        )
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, "-o", ms=4, color=COLORS.get(cand, "tab:blue"), label=label)
            for x, y in zip(xs, ys):
                if cand == "torch.cond":
                    ax.annotate(
                        f"{y:.0f}x", (x, y), textcoords="offset points", xytext=(0, 5), fontsize=7
                    )
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("elements per tensor (float32)")
    ax.set_ylabel("time per call / Python if (log)")
    ax.set_title("eager cond, 1 op per branch: torch.cond for scale")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right")


def _figure(path: str, title: str, panels, header: dict) -> str:
    """One row of panels, ``panel(ax, data)`` each, titled, with ``header``'s run line."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.7 * len(panels), 4))
    for ax, (panel, data) in zip(axes, panels):
        panel(ax, data)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    _subtitle(fig, header)
    return _save(fig, path)


def plot_eager(data: dict, path: str) -> str:
    return _figure(
        path,
        "Eager: torchcond cond/switch against the same code as a Python if (CPU)",
        [(eager_ratio, data), (eager_vs_torch_cond, data)]
        + ([(every_branch, data)] if data["results"].get("every_branch") else []),
        data,
    )


# --- select -------------------------------------------------------------------------------


def select_gbps(ax, data: dict) -> None:
    pts = data["results"]["size_sweep"]
    xs = [p["bytes_per_output"] for p in pts]
    for cand, label in (
        ("copy_", "copy_ of the same bytes (reference)"),
        ("select", "select, batched pred"),
        ("select, 0-d pred", "select, 0-d pred"),
        ("torch.where", "torch.where per output"),
    ):
        ys = [p["output_gbps"].get(cand) for p in pts]
        ls = "--" if cand == "copy_" else "-"
        ax.plot(xs, ys, ls, marker="o", ms=4, color=COLORS[cand], label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([common.fmt_bytes(x) for x in xs])
    ax.set_xlabel("bytes per output (16 float32 outputs)")
    ax.set_ylabel("output GB/s (output bytes / time)")
    ax.set_title("select throughput against output size")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center right")


def _speedups(ax, pts, xs, ticklabels, series, xlabel: str, title: str) -> None:
    """Each series' speedup over torch.where (the line at 1x), on log axes."""
    for cand, label in series:
        ys = [p["speedup_vs_where"][cand] for p in pts]
        ls = "--" if cand == "copy_" else "-"
        ax.plot(xs, ys, ls, marker="o", ms=4, color=COLORS[cand], label=label)
    ax.axhline(1.0, color=COLORS["torch.where"], lw=1, label="torch.where per output")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels(ticklabels)
    ax.set_xlabel(xlabel)
    _log_speedup(ax)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")


def select_speedup_size(ax, data: dict) -> None:
    pts = data["results"]["size_sweep"]
    xs = [p["bytes_per_output"] for p in pts]
    series = (
        ("select", "select, batched pred"),
        ("select, 0-d pred", "select, 0-d pred"),
        ("copy_", "copy_ of the same bytes"),
    )
    _speedups(
        ax,
        pts,
        xs,
        [common.fmt_bytes(x) for x in xs],
        series,
        "bytes per output (16 float32 outputs)",
        "select vs torch.where, 16 outputs",
    )


def select_count(ax, data: dict) -> None:
    pts = data["results"]["count_sweep"]
    xs = [p["outputs"] for p in pts]
    series = (("select", "select, batched pred"), ("copy_", "copy_ of the same bytes"))
    _speedups(
        ax,
        pts,
        xs,
        [str(x) for x in xs],
        series,
        "number of outputs (64x64 float32 each)",
        "select vs torch.where against output count",
    )


def _log_speedup(ax) -> None:
    """Speedups on a log axis: select's 0.5-4x and the copy's up to ~30x both readable."""
    ax.set_yscale("log", base=2)
    lo, hi = ax.get_ylim()
    lo = min(lo, 0.5) if lo < 1 else lo
    ax.set_ylim(lo, hi)
    ticks = [2.0**k for k in range(-3, 7) if lo / 1.01 <= 2.0**k <= hi * 1.01]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{t:g}x" for t in ticks])
    ax.set_ylabel("speedup over torch.where (log)")


def plot_select(data: dict, path: str) -> str:
    return _figure(
        path,
        "Fused select (CPU): one call for all outputs against one torch.where each",
        [(select_gbps, data), (select_speedup_size, data), (select_count, data)],
        data,
    )


# --- compile ------------------------------------------------------------------------------


def compile_per_call(ax, data: dict) -> None:
    rows = data["results"]["per_call"]
    labels = [f"{r['case']}\n{r['size']}" for r in rows]
    ys = [r["ratio"] for r in rows]
    bars = ax.bar(range(len(rows)), ys, color="tab:blue", width=0.6)
    for b, y in zip(bars, ys):
        ax.annotate(
            f"{y:.3f}x",
            (b.get_x() + b.get_width() / 2, y),
            textcoords="offset points",
            xytext=(0, 2),
            ha="center",
            fontsize=7,
        )
    ax.axhline(1.0, color="0.3", lw=0.8, label="torch.cond (switch: nested torch.cond)")
    ax.axhline(1.05, color="tab:red", lw=0.8, ls=":", label="target: 1.05x")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels)
    ax.set_ylim(0, max([*ys, 1.05]) * 1.25)
    ax.set_ylabel("time per call, torchcond / torch.cond")
    ax.set_title("compiled (Inductor), per call")
    ax.legend(loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)


def compile_first_call(ax, data: dict) -> None:
    rows = data["results"].get("first_call", [])
    width = 0.38
    for j, (lib, label) in enumerate((("torchcond", "torchcond"), ("torch_cond", "torch.cond"))):
        xs = [i + (j - 0.5) * width for i in range(len(rows))]
        med = [r["median_first_s"][lib] for r in rows]
        color = COLORS["torchcond" if lib == "torchcond" else "torch.cond"]
        ax.bar(xs, med, width=width, color=color, alpha=0.75, label=f"{label} (median)")
        for x, r in zip(xs, rows):
            samples = r["first_s"][lib]
            ax.plot([x] * len(samples), samples, "k.", ms=4)
    for i, r in enumerate(rows):
        top = max(max(r["first_s"]["torchcond"]), max(r["first_s"]["torch_cond"]))
        ax.annotate(
            f"{r['ratio']:.2f}x",
            (i, top),
            textcoords="offset points",
            xytext=(0, 3),
            ha="center",
            fontsize=8,
        )
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["case"] for r in rows])
    ax.set_ylabel("first call, compile included (s)")
    ax.set_title("compile: first call in a fresh process, small size\n(dots: samples)")
    tops = [max(max(r["first_s"]["torchcond"]), max(r["first_s"]["torch_cond"])) for r in rows]
    ax.set_ylim(0, max([*tops, 1]) * 1.25)
    ax.legend(loc="lower right")
    ax.grid(True, axis="y", alpha=0.3)


def plot_compile(data: dict, path: str) -> str:
    return _figure(
        path,
        "torch.compile (Inductor): the same model with torchcond and with torch.cond",
        [(compile_per_call, data), (compile_first_call, data)],
        data,
    )


# --- GPU ----------------------------------------------------------------------------------


def _target_value(target: str) -> float | None:
    """``">= 1.4"`` -> 1.4: where a claim's target line goes; None without a target."""
    try:
        return float(target.lstrip(">=< "))
    except ValueError:
        return None


def plot_gpu(data: dict, path: str) -> str:
    """A GPU script's claims: each ratio as a bar, its target as a tick (red when missed)."""
    plt = _plt()
    claims = data["claims"]
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(claims) + 1.6))
    ys = range(len(claims))
    colors = ["tab:red" if c["meets"] is False else "tab:blue" for c in claims]
    ax.barh(list(ys), [c["value"] for c in claims], color=colors, height=0.6)
    for y, c in zip(ys, claims):
        target = _target_value(c["target"])
        if target is not None:
            ax.plot([target, target], [y - 0.4, y + 0.4], color="0.2", lw=2)
        ax.text(c["value"], y, f" {c['value']:.3g}", va="center", fontsize=8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([c["claim"] for c in claims])
    ax.invert_yaxis()
    ax.set_xlabel("ratio against the baseline measured in the same run (black tick: target)")
    ax.grid(True, axis="x", alpha=0.3)
    h = data["header"]
    ax.set_title(f"{h['benchmark']} on {h.get('device', 'an unnamed GPU')} ({h['mode']} run)")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.text(
        0.5,
        0.005,
        f"{h['commit']}, torch {h['torch']}, CUDA {h.get('cuda')}, {h['date_utc'][:10]}",
        ha="center",
        va="bottom",
        fontsize=7,
        color="0.3",
    )
    return _save(fig, path)


def make_gpu_plots(results_dir: str) -> list[str]:
    """A plot beside every GPU result (``<name>_gpu-<device>.json``) that has claims."""
    out = []
    for name in sorted(os.listdir(results_dir)):
        if "_gpu-" not in name or not name.endswith(".json"):
            continue
        with open(os.path.join(results_dir, name)) as fh:
            data = json.load(fh)
        if data.get("claims"):
            out.append(plot_gpu(data, os.path.join(results_dir, name[: -len(".json")] + ".png")))
    return out


# --- summary ------------------------------------------------------------------------------


def plot_summary(eager: dict, select: dict, compile_: dict, path: str) -> str:
    """One panel per benchmark: the README's plot."""
    return _figure(
        path,
        "torchcond on the CPU: ratios against baselines measured in the same run",
        [(eager_ratio, eager), (select_speedup_size, select), (compile_per_call, compile_)],
        eager,
    )


def make_plots(results_dir: str) -> list[str]:
    """Draw every plot whose JSON is in ``results_dir``; returns the PNG paths."""

    def load(name):
        path = os.path.join(results_dir, f"{name}.json")
        if not os.path.exists(path):
            return None
        with open(path) as fh:
            return json.load(fh)

    data = {name: load(name) for name in ("eager", "select", "compile")}
    out = []
    if data["eager"] and "sweep" in data["eager"]["results"]:
        out.append(plot_eager(data["eager"], os.path.join(results_dir, "eager.png")))
    if data["select"] and "size_sweep" in data["select"]["results"]:
        out.append(plot_select(data["select"], os.path.join(results_dir, "select.png")))
    if data["compile"]:
        out.append(plot_compile(data["compile"], os.path.join(results_dir, "compile.png")))
    if all(out and data[k] for k in data) and len(out) == 3:
        out.append(
            plot_summary(
                data["eager"],
                data["select"],
                data["compile"],
                os.path.join(results_dir, "summary.png"),
            )
        )
    return out
