"""Run directories -> figures and tables: per-run curves, multi-seed mean +/- std, peak/final/AUC, Spearman.

The referee's requests this file answers (review.md, "Missing seed variance", "Peak-of-training as headline metric",
"Overstated 'twice as reliably'"):

* every arm is summarised over seeds as mean +/- std (sample std, ddof=1) with the seed count printed next to it;
* three task metrics per run, read from the validation curve `val/success`:
    peak  = max over evaluations (the paper's headline, biased upwards by noise),
    final = mean of the last `--final-window` evaluations,
    auc   = mean over all evaluations (area under the learning curve divided by its length);
* `--spearman KEY` correlates a per-run diagnostic (its mean over the run, e.g. `mi_trajectory/mi_zscore_ema`)
  with each task metric across runs (the paper's Fig. 8/9 claim), Spearman's rho with average ranks for ties.

Arms are formed by grouping runs whose `config.json` flags agree on everything except `seed`, `name`, `resume`
and the bookkeeping flags; `--arm-by a,b` groups by chosen flags instead.

What it leaves out: significance tests beyond rho (with few seeds a permutation p-value is printed for rho, not
a t-test), and any smoothing of curves.

Run:
    python report.py runs/*                       # table of arms, mean +/- std over seeds
    python report.py runs/* --arm-by filter,filter_value --spearman mi_trajectory/mi_zscore_ema
    python report.py --plot runs/demo             # (re)write runs/demo/plots/*.png
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from runlog import read_metrics

# Flags that never distinguish arms.
BOOKKEEPING = {"seed", "name", "resume", "out_dir", "save_every", "eval_every", "log_samples", "progress",
               "trackers", "steps"}

# Curves drawn by plot_run, in panel order: (title, metric keys drawn in that panel).
PANELS = [
    ("return / success / format (train)", ["rollout/return", "rollout/success", "rollout/format_ok_rate"]),
    ("validation success", ["val/success"]),
    ("kept fraction (filter)", ["filter/kept_frac"]),
    ("reward variance (RV)", ["filter/rv_mean", "filter/kept_rv_mean"]),
    ("retrieval accuracy (first turn)", ["mi_first_turn/retrieval_accuracy", "mi_first_turn/retrieval_chance_level",
                                         "mi_first_turn_frozen/retrieval_accuracy"]),
    ("MI estimate (per token)", ["mi_first_turn/mi_estimate", "mi_trajectory/mi_estimate",
                                 "mi_first_turn_frozen/mi_estimate"]),
    ("MI-ZScore-EMA", ["mi_first_turn/mi_zscore_ema", "mi_trajectory/mi_zscore_ema"]),
    ("H(Z|X) proxy / token entropy", ["mi_first_turn/conditional_entropy_est", "train/entropy"]),
    ("losses", ["train/pg_loss", "train/value_loss", "train/kl"]),
    ("tokens per turn", ["rollout/response_tokens"]),
    ("‖g_task‖ / ‖g_ent + g_KL‖ (snr.py, all groups)", ["grad/all/task_over_reg"]),
]


# --------------------------------------------------------------------------------------------- per-run numbers
def curve(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one metric over a run, skipping steps where it was not logged."""
    pts = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None and _finite(r[key])]
    if not pts:
        return np.zeros(0), np.zeros(0)
    s, v = zip(*pts)
    return np.asarray(s, dtype=float), np.asarray(v, dtype=float)


def task_metrics(rows: list[dict], key: str = "val/success", final_window: int = 3) -> dict:
    """peak / final / auc of one run's validation curve (NaN if it was never evaluated)."""
    _, v = curve(rows, key)
    if v.size == 0:
        return {"peak": math.nan, "final": math.nan, "auc": math.nan, "n_evals": 0}
    return {"peak": float(v.max()), "final": float(v[-final_window:].mean()), "auc": float(v.mean()),
            "n_evals": int(v.size)}


def spearman(x, y) -> float:
    """Spearman's rho = Pearson correlation of average ranks (ties share their mean rank)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    rx, ry = _avg_rank(x), _avg_rank(y)
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_pvalue(x, y, n_perm: int = 2000, seed: int = 0) -> float:
    """Two-sided permutation p-value of rho (exact enough for the handful of runs a sweep has)."""
    rho = spearman(x, y)
    if math.isnan(rho):
        return math.nan
    rng = np.random.default_rng(seed)
    null = np.array([spearman(x, rng.permutation(y)) for _ in range(n_perm)])
    return float((np.sum(np.abs(null) >= abs(rho) - 1e-12) + 1) / (n_perm + 1))


def _avg_rank(a: np.ndarray) -> np.ndarray:
    order = np.argsort(a, kind="stable")
    ranks = np.empty(a.size)
    ranks[order] = np.arange(a.size, dtype=float)
    for val in np.unique(a):  # ties -> mean rank
        idx = a == val
        ranks[idx] = ranks[idx].mean()
    return ranks


# --------------------------------------------------------------------------------------------------- arms
def load_runs(dirs: list[str]) -> list[dict]:
    runs = []
    for d in dirs:
        p = Path(d)
        if not (p / "config.json").exists():
            continue
        runs.append({"dir": str(p), "flags": json.loads((p / "config.json").read_text())["flags"],
                     "rows": read_metrics(p)})
    return runs


def arm_key(flags: dict, arm_by: list[str] | None) -> str:
    if arm_by:
        return ", ".join(f"{k}={flags.get(k)}" for k in arm_by)
    return json.dumps({k: v for k, v in sorted(flags.items()) if k not in BOOKKEEPING}, sort_keys=True)


def summarise(runs: list[dict], arm_by: list[str] | None, final_window: int = 3) -> list[dict]:
    """One row per arm: mean +/- std over seeds of peak/final/auc."""
    arms: dict[str, list[dict]] = {}
    for r in runs:
        arms.setdefault(arm_key(r["flags"], arm_by), []).append(r)
    table = []
    for key, members in arms.items():
        ms = [task_metrics(r["rows"], final_window=final_window) for r in members]
        row = {"arm": key if arm_by else _short_arm(members, runs), "n_seeds": len(members),
               "seeds": sorted(r["flags"].get("seed") for r in members)}
        for m in ("peak", "final", "auc"):
            vals = np.array([x[m] for x in ms], float)
            vals = vals[~np.isnan(vals)]
            row[m] = (float(vals.mean()) if vals.size else math.nan,
                      float(vals.std(ddof=1)) if vals.size > 1 else math.nan)
        table.append(row)
    return table


def _short_arm(members: list[dict], runs: list[dict]) -> str:
    """Name an arm by the flags that differ between arms (readable instead of the full flag dump)."""
    varying = {k for r in runs for k, v in r["flags"].items()
               if k not in BOOKKEEPING and any(o["flags"].get(k) != v for o in runs)}
    f = members[0]["flags"]
    return ", ".join(f"{k}={f.get(k)}" for k in sorted(varying)) or "all runs"


def format_table(table: list[dict]) -> str:
    lines = ["| arm | seeds | peak | final | AUC |", "|---|---|---|---|---|"]
    for row in table:
        cells = [f"{m:.3f} ± {s:.3f}" if not math.isnan(s) else f"{m:.3f} (1 seed)" for m, s in
                 (row["peak"], row["final"], row["auc"])]
        lines.append(f"| {row['arm']} | {row['n_seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ plots
def plot_run(run_dir: str | Path) -> list[Path]:
    """Write one PNG per panel with data into `<run>/plots/`, plus an overview grid. Returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    out = run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    panels = [(t, [(k, *curve(rows, k)) for k in keys]) for t, keys in PANELS]
    panels = [(t, [c for c in cs if c[1].size]) for t, cs in panels]
    panels = [(t, cs) for t, cs in panels if cs]
    if not panels:
        return []
    n = len(panels)
    cols = 3
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(4.2 * cols, 3.0 * ((n + cols - 1) // cols)),
                             squeeze=False)
    for ax, (title, cs) in zip(axes.flat, panels):
        for key, s, v in cs:
            ax.plot(s, v, marker="o" if s.size < 30 else None, ms=3, label=key)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(run_dir.name, fontsize=10)
    fig.tight_layout()
    path = out / "overview.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths = [path]
    analysed = [r for r in rows if "grad/all/task" in r]
    if analysed:                      # paper Fig. 3 for the last step with a gradient analysis (--grad-analysis-every)
        import snr
        last = analysed[-1]
        paths.append(out / "grad_buckets.png")
        snr.plot_buckets({k: v for k, v in last.items() if k.startswith("grad/")}, paths[-1],
                         title=f"{run_dir.name}, step {last['step']}")
    return paths


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories (runs/<name>)")
    ap.add_argument("--arm-by", default="", help="comma-separated flags that define an arm (default: all but seed)")
    ap.add_argument("--final-window", type=int, default=3, help="evaluations averaged for the 'final' metric")
    ap.add_argument("--spearman", default="", help="metric key whose per-run mean is correlated with task metrics")
    ap.add_argument("--plot", action="store_true", help="write <run>/plots/overview.png for every run")
    args = ap.parse_args(argv)
    if args.final_window < 1:
        raise SystemExit("--final-window must be >= 1")
    if args.plot:
        for d in args.runs:
            for p in plot_run(d):
                print(f"wrote {p}")
        return
    runs = load_runs(args.runs)
    if not runs:
        raise SystemExit("no run directories with a config.json among the arguments")
    arm_by = [a.strip() for a in args.arm_by.split(",") if a.strip()] or None
    print(format_table(summarise(runs, arm_by, args.final_window)))
    if args.spearman:
        diag = [np.nanmean(curve(r["rows"], args.spearman)[1]) if curve(r["rows"], args.spearman)[1].size
                else math.nan for r in runs]
        print(f"\nSpearman rho of mean({args.spearman}) with task metrics across {len(runs)} runs:")
        for m in ("peak", "final", "auc"):
            task = [task_metrics(r["rows"], final_window=args.final_window)[m] for r in runs]
            ok = [i for i in range(len(runs)) if _finite(diag[i]) and _finite(task[i])]
            x, y = [diag[i] for i in ok], [task[i] for i in ok]
            print(f"  {m:5s}: rho = {spearman(x, y):+.3f}  (permutation p = {spearman_pvalue(x, y):.3f}, n = {len(ok)})")


if __name__ == "__main__":
    main()
