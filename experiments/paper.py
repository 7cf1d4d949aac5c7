"""One driver per paper table/figure: each expands into `python train.py ...` runs (arms x seeds), then report.py.

Every experiment of RAGEN-2 that the official code can run, plus the ones it cannot (trajectory-level filter,
RV-quartile training, the dilution control the referee's question calls for), as a list of runs:

    python experiments/paper.py list                          # experiments and what each reproduces
    python experiments/paper.py main_table --dry-run          # print the commands
    python experiments/paper.py quartiles --seeds 0 1 2       # run them one after another, then summarise
    python experiments/paper.py top_p_sweep --scale paper --model Qwen/Qwen2.5-3B   # the paper's scale (GPU)
    python experiments/paper.py classroom --seeds 0 1 2       # template collapse vs filtering on SmolLM2, ~90 min
    python experiments/paper.py protocol                      # the same at the regime search's setting, 6 seeds
    python experiments/paper.py calibration                   # the MI proxy on batches of known I(X;Z), minutes
    python experiments/paper.py multiturn --seeds 0 1 2       # the same on multi-turn FrozenLake (MULTITURN.md)
    python experiments/paper.py slip_boundary --seeds 0 1     # filter vs none at slip 0 / 0.2 / 0.5 (SLIP.md)

`--scale cpu` (default) keeps each run small enough for a CPU (SmolLM2, P=4 x G=4, 20 steps; the numbers then
say whether the pipeline behaves as claimed, not what the paper measured); `--scale paper` uses `--preset paper`
(P=8, G=16, 400 steps). `classroom` is the evidence protocol of experiments/RESULTS.md (its own scale, chosen by a
recorded pilot: experiments/classroom.md); `multiturn` and `slip_boundary` run at the `multiturn` scale, every arm
and seed from one shared warm start (experiments/warmstart.py, made once into <out-dir>/warm-model) because the
untrained model writes no valid FrozenLake move (experiments/multiturn.md), and `multiturn`'s page carries the
input-agnostic baseline of its validation maps (experiments/agnostic.py); `--scale smoke` runs any experiment on
the tiny random model in seconds (the test suite runs the classroom and multi-turn protocols that way). Every driver ends by writing a Markdown page through
report.py: experiments/RESULTS.md for the classroom protocol at its own scale, `<out-dir>/<experiment>.md` otherwise.
Flags the driver does not know are passed on to every train.py run (`--lr 1e-5`, `--entropy-coef 0.01`, ...). Seeds default to 3, the minimum the referee asks for; every arm is summarised as
mean +/- std over seeds with peak, final and AUC (report.py), not the peak alone.
Runs that already finished (`finished.json` present) are skipped, so an interrupted driver can simply be started again (unfinished runs
are continued with --resume).

What it leaves out: the multimodal (VAGEN) rows, the WebShop/SearchQA/DeepCoder rows (the offline minis exist,
`--env searchqa|webshop|deepcoder` passes through, but no driver arm uses them), and the 14B row of the Std/Mean(RV)
table; scheduling across machines (runs are sequential; use the printed commands with your own scheduler).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                  # config, report, runlog live at the repository root
FILTER = ["--filter", "top_p", "--filter-value", "0.9"]            # the paper's rule (mass, variance, no zeros)
NOFILTER = ["--filter", "none"]
# filter vs no filter vs the dilution control (no filter, entropy coefficient x the filter run's kept fraction)
THREE_ARMS = {"filter": FILTER, "nofilter": NOFILTER, "nofilter-diluted": [*NOFILTER, "--entropy-coef", "@diluted"]}
CALIBRATION = ROOT / "experiments" / "calibration.json"          # written by `paper.py calibration`

# name -> (what it reproduces, {arm: flags}, flags for the report's --arm-by)
EXPERIMENTS = {
    "main_table": ("main results, v1 Table 4 (review Table 3): 4 algorithms x filter on/off",
                   {f"{algo}-{tag}": ["--algo", algo, *flags] for algo in ("ppo", "dapo", "grpo", "drgrpo")
                    for tag, flags in (("filter", FILTER), ("nofilter", NOFILTER))}, "algo,filter"),
    "main_table_code": ("main table as the official scripts ran it: softmax top-p on std, include_zero on",
                        {f"{algo}-{tag}": ["--algo", algo, *flags] for algo in ("ppo", "grpo")
                         for tag, flags in (("filter", ["--filter", "top_p", "--filter-value", "0.9",
                                                        "--filter-mode", "softmax", "--filter-metric", "reward_std",
                                                        "--filter-include-zero"]),
                                            ("nofilter", NOFILTER))}, "algo,filter"),
    "top_p_sweep": ("kept-mass sweep, top-p in {1.0, 0.95, 0.9, 0.8, 0.6, 0.4} + no filter (v1 Fig. 6/Table 9)",
                    {**{f"top_p{v}": ["--filter", "top_p", "--filter-value", str(v)] for v in (1.0, 0.95, 0.9, 0.8,
                                                                                              0.6, 0.4)},
                     "nofilter": NOFILTER}, "filter,filter_value"),
    "filter_rules": ("filter-rule / metric ablation, v1 Table 9 (review Table 5)",
                     {"top_p0.9": FILTER, "top_p0.5": ["--filter", "top_p", "--filter-value", "0.5"],
                      "min_p0.05": ["--filter", "min_p", "--filter-value", "0.05"],
                      "min_p0.2": ["--filter", "min_p", "--filter-value", "0.2"],
                      "top_k0.25": ["--filter", "top_k", "--filter-value", "0.25"],
                      "top_k0.5": ["--filter", "top_k", "--filter-value", "0.5"],
                      "top_k0.5-smallest": ["--filter", "top_k", "--filter-value", "0.5", "--filter-smallest"],
                      "reward_sum": [*FILTER, "--filter-metric", "reward_sum"],
                      "entropy": [*FILTER, "--filter-metric", "entropy"],
                      "entropy_variance": [*FILTER, "--filter-metric", "entropy_variance"],
                      "length": [*FILTER, "--filter-metric", "length"],
                      "nofilter": NOFILTER}, "filter,filter_value,filter_metric,filter_smallest"),
    "quartiles": ("RV-quartile ablation, v1 Table 6 (review Table 8): train on one RV quartile only",
                  {f"Q{q}": ["--filter", "none", "--filter-quartile", str(q), "--filter-include-zero"]
                   for q in (1, 2, 3, 4)}, "filter_quartile"),
    "trajectory_vs_prompt": ("trajectory- vs prompt-level filtering, v1 Table 7 (review Table 9)",
                             {"nofilter": NOFILTER, "prompt": FILTER,
                              "trajectory": ["--filter", "none", "--filter-level", "trajectory"]},
                             "filter,filter_level"),
    "dilution_control": ("is filtering just diluted regularisation? no filter with entropy_coef x kept fraction",
                         THREE_ARMS, "name"),
    "classroom": ("the evidence protocol (experiments/RESULTS.md): template collapse and top-p 0.9 vs no filter vs "
                  "the dilution control on SmolLM2, deterministic Bandit",
                  THREE_ARMS, "name"),
    "multiturn": ("multi-turn evidence (experiments/MULTITURN.md): top-p 0.9 vs no filter vs the dilution control on "
                  "FrozenLake 4x4, 3 turns, from the shared warm start (experiments/warmstart.py)",
                  THREE_ARMS, "name"),
    "slip_boundary": ("the filter's edge as RV turns into transition noise (v1 Fig. 9 / review Fig. 11), multi-turn "
                      "FrozenLake from the shared warm start: filter vs none at slip 0, 0.2, 0.5",
                      {f"slip{s}-{tag}": ["--env-options", f'{{"slip": {s}}}', *flags]
                       for s in (0.0, 0.2, 0.5) for tag, flags in (("filter", FILTER), ("nofilter", NOFILTER))},
                      "name"),
    "regime_search": ("pilots that slow the classroom dynamics, each placed on the regime map (experiments/REGIME.md): "
                      "Dr.GRPO at lr 5e-6 with entropy 0.01 / 0.03, PPO with a critic, GRPO at temperature 1; no filter",
                      {"drgrpo-ent0.01": [*NOFILTER, "--algo", "drgrpo", "--lr", "5e-6", "--entropy-coef", "0.01"],
                       "drgrpo-ent0.03": [*NOFILTER, "--algo", "drgrpo", "--lr", "5e-6", "--entropy-coef", "0.03"],
                       "ppo": [*NOFILTER, "--algo", "ppo", "--lr", "5e-6", "--critic-lr", "1e-5",
                               "--entropy-coef", "0.01"],
                       "grpo-T1": [*NOFILTER, "--temperature", "1.0"]}, "name"),
    "protocol": ("the single-turn protocol that can decide (experiments/PROTOCOL.md): the regime search's setting "
                 "(Dr.GRPO, lr 5e-6, entropy 0.01), top-p 0.9 vs no filter vs the dilution control, 6 seeds, "
                 "validated on 64 episodes of the Bandit's test arm pairs",
                 THREE_ARMS, "name"),
    "kl_sweep": ("KL-coefficient sweep without filtering (v1 App. L, review App. M)",
                 {f"kl{c}": [*NOFILTER, "--kl-coef", str(c), "--kl-kind", "k1", "--entropy-coef", "0"]
                  for c in (0, 0.001, 0.01, 0.1)}, "kl_coef"),
    "entropy_sweep": ("entropy-coefficient sweep without filtering (v1 App. M, review App. N)",
                      {f"ent{c}": [*NOFILTER, "--entropy-coef", str(c)] for c in (0, 0.001, 0.01, 0.1)},
                      "entropy_coef"),
    "slip_sweep": ("FrozenLake stochasticity sweep, v1 Fig. 9 (review Fig. 11): filter vs none per slip rate",
                   {f"slip{s}-{tag}": ["--env", "frozenlake", "--env-options", f'{{"slip": {s}}}', *flags]
                    for s in (0.0, 0.1, 0.5, 1.0) for tag, flags in (("filter", FILTER), ("nofilter", NOFILTER))},
                   "env_options,filter"),
    "mi_controls": ("MI proxy with the referee's controls: frozen scorer side by side, permutation null",
                    {"nofilter": [*NOFILTER, "--mi-scorer", "both", "--mi-null", "50", "--mi-every", "2"],
                     "filter": [*FILTER, "--mi-scorer", "both", "--mi-null", "50", "--mi-every", "2"]},
                    "filter"),
}

SCALES = {
    "cpu": ["--model", "smollm2-135m", "--env", "bandit", "--groups", "4", "--group-size", "4", "--steps", "20",
            "--max-new-tokens", "48", "--mini-batch", "16", "--lr", "1e-5", "--eval-every", "5", "--val-envs", "32",
            "--mi-every", "5", "--mi-samples", "16", "--save-every", "5", "--temperature", "0.7",
            "--filter-eps", "0", "--early-stop-empty", "0"],   # why: the comment on PRESETS["demo"] in config.py
    "paper": ["--preset", "paper"],
    # The classroom protocol (experiments/classroom.md says why each value): a task whose reward is its success, so
    # RV = p(1-p) is signal and the input-agnostic template ("always the first-listed arm") has a known 50 %.
    "classroom": ["--model", "smollm2-135m", "--env", "bandit", "--env-options", '{"payout": "deterministic"}',
                  "--algo", "grpo", "--groups", "4", "--group-size", "8", "--steps", "16", "--max-new-tokens", "48",
                  "--temperature", "0.7", "--lr", "5e-5", "--entropy-coef", "0.001", "--mini-batch", "32",
                  "--micro-batch", "8", "--filter-eps", "0", "--early-stop-empty", "0", "--eval-every", "2",
                  "--val-envs", "16", "--mi-every", "2", "--mi-samples", "32", "--mi-families", "first_turn",
                  "--mi-scorer", "both", "--mi-null", "50", "--save-every", "2", "--log-samples", "4",
                  "--score-temperature", "1", "--prompt-budgets", "env",
                  "--no-progress"],   # the committed runs scored MI at T = 1 and told the model 100 words, not 48
    # The multi-turn protocol (experiments/multiturn.md says why each value); its arms start from WARM["multiturn"].
    "multiturn": ["--env", "frozenlake", "--max-turns", "3", "--max-new-tokens", "48", "--groups", "4",
                  "--group-size", "8", "--algo", "drgrpo", "--lr", "1e-5", "--entropy-coef", "0.01",
                  "--temperature", "1.0", "--steps", "16", "--mini-batch", "32", "--micro-batch", "8",
                  "--filter-eps", "0", "--early-stop-empty", "0", "--eval-every", "8", "--val-envs", "64",
                  "--mi-every", "4", "--mi-samples", "32", "--mi-families", "first_turn,trajectory",
                  "--mi-scorer", "both", "--mi-null", "20", "--save-every", "2", "--log-samples", "4",
                  "--no-progress"],   # MI and validation less often than the pilot's 2 / 4: they were 3/4 of its time
    # The multi-turn drivers on the tiny random model (tests): FrozenLake, 2 turns, a one-epoch warm start.
    "smoke-multiturn": ["--env", "frozenlake", "--max-turns", "2", "--max-new-tokens", "16", "--groups", "2",
                        "--group-size", "4", "--algo", "drgrpo", "--steps", "2", "--mini-batch", "8",
                        "--micro-batch", "4", "--filter-eps", "0", "--early-stop-empty", "0", "--eval-every", "1",
                        "--val-envs", "4", "--mi-every", "1", "--mi-samples", "8",
                        "--mi-families", "first_turn,trajectory", "--mi-scorer", "both", "--mi-null", "5",
                        "--save-every", "1", "--no-bf16", "--no-progress"],
    # Any experiment on the tiny random model in seconds (tests; it checks the plumbing, not the claims).
    "smoke": ["--model", "tiny", "--env", "bandit", "--env-options", '{"payout": "deterministic"}', "--algo", "grpo",
              "--groups", "2", "--group-size", "4", "--steps", "2", "--max-new-tokens", "8", "--mini-batch", "8",
              "--micro-batch", "4", "--filter-eps", "0", "--early-stop-empty", "0", "--eval-every", "1",
              "--val-envs", "2", "--mi-every", "1", "--mi-samples", "8", "--mi-families", "first_turn",
              "--mi-scorer", "both", "--mi-null", "5", "--save-every", "1", "--no-bf16", "--no-progress"],
}
# Scales whose arms all start from one warm start: experiments/warmstart.py's flags (its --max-turns and
# --max-new-tokens are the scale's). The untrained SmolLM2 writes no valid FrozenLake move (experiments/multiturn.md).
WARM = {"multiturn": ["--model", "smollm2-135m", "--episodes", "64", "--epochs", "2", "--lr", "1e-4"],
        "smoke-multiturn": ["--model", "tiny", "--episodes", "4", "--epochs", "1"]}
DEFAULT_SCALE = {"classroom": "classroom", "regime_search": "classroom", "protocol": "protocol",
                 "multiturn": "multiturn", "slip_boundary": "multiturn"}
SCALE_FOR = {"protocol": ("protocol",)}   # scales made for some experiments only (protocol: Bandit, test split)
DEFAULT_SEEDS = {"protocol": [0, 1, 2, 3, 4, 5]}   # the exact paired sign-flip test reaches p < 0.05 from 6 seeds
PILOT = ["--steps", "24", "--eval-every", "4", "--mi-every", "2"]   # regime_search: longer, coarser evaluation
SMOKE_SCALE = {"multiturn": "smoke-multiturn", "slip_boundary": "smoke-multiturn"}   # what --scale smoke means
# (out-dir, page) of an experiment run at its own scale; otherwise runs/ and <out-dir>/<experiment>.md
HOME = {"classroom": ("experiments/classroom", "experiments/RESULTS.md"),
        "regime_search": ("experiments/regime", "experiments/REGIME.md"),
        "protocol": ("experiments/protocol", "experiments/PROTOCOL.md"),
        "multiturn": ("experiments/multiturn", "experiments/MULTITURN.md"),
        "slip_boundary": ("experiments/multiturn", "experiments/SLIP.md")}
AGNOSTIC = "agnostic.json"                    # <out-dir>/agnostic.json: the input-agnostic ceiling of the val maps
# What the page of an experiment shows beyond the task metrics (report.py --columns / --pairs / --figure-keys).
MI, MI_FROZEN = "mi_first_turn/mi_estimate", "mi_first_turn_frozen/mi_estimate"
PAGES = {
    "classroom": dict(
        columns=[f"{MI}@first", MI, f"{MI}_null_mean", f"{MI_FROZEN}@first", MI_FROZEN,
                 "mi_first_turn/retrieval_accuracy", "mi_first_turn/conditional_entropy_est", "train/entropy@first",
                 "train/entropy", "rollout/format_ok_rate", "rollout/success", "filter/kept_frac@mean",
                 "filter/zero_rv_count@mean", "filter/rv_std_over_mean@mean", "time/step@mean"],
        pairs=[("filter", "nofilter"), ("filter", "nofilter-diluted"), ("nofilter-diluted", "nofilter")],
        figure=["val/success", "rollout/success", "rollout/format_ok_rate", MI, f"{MI}_null_mean", MI_FROZEN,
                "mi_first_turn/retrieval_accuracy", "train/entropy", "filter/zero_rv_count", "filter/kept_frac",
                "rollout/response_tokens", "time/step"]),
}
MT, MT_FROZEN = "mi_trajectory/retrieval_accuracy", "mi_trajectory_frozen/retrieval_accuracy"
PAGES["multiturn"] = dict(
    columns=[f"{MI}@first", MI, f"{MI}_null_mean", f"{MI_FROZEN}@first", MI_FROZEN,
             "mi_first_turn/retrieval_accuracy", f"{MT}@first", MT, f"{MT}_null_mean", MT_FROZEN,
             "mi_first_turn/conditional_entropy_est", "train/token_entropy@first", "train/token_entropy",
             "rollout/format_ok_rate", "rollout/valid_turn_rate", "rollout/turns", "rollout/success_by_turn1",
             "rollout/success", "val/success_by_turn1", "val/turns", "filter/kept_frac@mean",
             "filter/zero_rv_count@mean", "time/step@mean"],
    pairs=PAGES["classroom"]["pairs"],
    figure=["val/success", "rollout/success", "rollout/valid_turn_rate", "rollout/turns", MI, f"{MI}_null_mean",
            MI_FROZEN, MT, "train/token_entropy", "filter/zero_rv_count", "filter/kept_frac", "time/step"])
PAGES["slip_boundary"] = dict(
    columns=PAGES["multiturn"]["columns"],
    pairs=[(f"slip{s}-filter", f"slip{s}-nofilter") for s in (0.0, 0.2, 0.5)],
    figure=["val/success", "rollout/success", "filter/rv_mean", "filter/zero_rv_count", MI, "train/token_entropy"])
# train/entropy is the entropy bonus in the loss aggregation's units (nats per sequence under Dr.GRPO's
# seq-mean-token-sum), so pages whose runs use Dr.GRPO show train/token_entropy (nats/token) instead.
TOKEN_ENTROPY = lambda keys: [k.replace("train/entropy", "train/token_entropy") for k in keys]   # noqa: E731
PAGES["regime_search"] = dict(columns=TOKEN_ENTROPY(PAGES["classroom"]["columns"]), pairs=[],
                              figure=TOKEN_ENTROPY(PAGES["classroom"]["figure"]))
PAGES["protocol"] = dict(columns=PAGES["regime_search"]["columns"], pairs=PAGES["classroom"]["pairs"],
                         figure=PAGES["regime_search"]["figure"])
PAGES["dilution_control"] = dict(          # the cpu / paper scales log neither the null nor the frozen scorer
    columns=[MI, "mi_first_turn/retrieval_accuracy", "train/entropy@first", "train/entropy", "rollout/format_ok_rate",
             "filter/kept_frac@mean", "filter/zero_rv_count@mean", "time/step@mean"],
    pairs=PAGES["classroom"]["pairs"],
    figure=["val/success", "rollout/success", MI, "train/entropy", "filter/kept_frac", "filter/zero_rv_count"])


def diluted_entropy(out_dir: str, name: str, seed: int, base: float) -> str:
    """The control's entropy coefficient: base x mean kept fraction (over steps, empty steps count 0) of the same
    seed's filter run (which runs first, arms are in dict order)."""
    import numpy as np
    from report import curve
    from runlog import read_metrics
    _, kept = curve(read_metrics(Path(out_dir) / f"{name}-filter-s{seed}"), "filter/kept_frac")
    if kept.size == 0:
        raise SystemExit(f"{name}: the filter run of seed {seed} has no filter/kept_frac yet; run it first")
    return f"{base * float(np.mean(kept)):.6g}"


def flag_value(argv: list[str], flag: str, default: str) -> str:
    """The value the last `flag X` / `flag=X` in argv gives (argparse: the last one wins), else default."""
    value = default
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def drop_flag(argv: list[str], flag: str) -> list[str]:
    """argv without any `flag X` / `flag=X`."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def override(base: list[str], flags: list[str]) -> list[str]:
    """base with every `--flag value` pair of flags replacing base's own (one value per flag in the command)."""
    for flag in flags[::2]:
        base = drop_flag(base, flag)
    return [*base, *flags]


# The protocol that can decide (experiments/protocol.md says why): the classroom scale at the regime search's
# Dr.GRPO pilot (the setting that learnt the format and left groups with RV 0 for the filter to act on), 24 steps,
# validation on the test split (arm pairs never trained on), MI and validation less often than the pilot's 2 / 4.
SCALES["protocol"] = override(SCALES["classroom"], [
    "--algo", "drgrpo", "--lr", "5e-6", "--entropy-coef", "0.01", "--steps", "24", "--eval-every", "8",
    "--mi-every", "4", "--val-envs", "64", "--val-env-options", '{"split": "test"}'])


def runs(name: str, scale: str, seeds: list[int], extra: list[str], out_dir: str,
         warm: list[str] = ()) -> list[tuple[str, list[str]]]:
    """(run name, train.py argv) for every arm x seed of one experiment. The dilution arm's entropy coefficient is
    the placeholder "@diluted" (base x kept fraction, filled in by `main` once the filter run exists); its base is
    the coefficient every other arm runs with (scale, then extra flags; the dataclass default otherwise).
    warm: flags every run gets after the scale's (["--model", <warm start>] for WARM scales)."""
    _, arms, _ = EXPERIMENTS[name]
    out = []
    for arm, flags in arms.items():
        for seed in seeds:
            run = f"{name}-{arm}-s{seed}"
            pilot = PILOT if name == "regime_search" else []
            argv = [*SCALES[scale], *warm, *pilot, *flags, *extra]
            if "@diluted" in flags:       # the explicit --entropy-coef is the base, not this arm's value
                argv = [*drop_flag([*SCALES[scale], *warm, *extra], "--entropy-coef"), *flags]
            out.append((run, [*argv, "--seed", str(seed), "--name", run, "--out-dir", out_dir]))
    return out


def started_from(model_dir: Path, out_dir: Path) -> list[str]:
    """Names of the runs in `out_dir` whose config.json names `model_dir` as --model (compared as resolved paths;
    a config.json that cannot be read counts as started: the check must not fail open)."""
    out = []
    for c in sorted(out_dir.glob("*/config.json")):
        try:
            model = json.loads(c.read_text()).get("flags", {}).get("model")
        except (OSError, json.JSONDecodeError):
            out.append(c.parent.name)
            continue
        if isinstance(model, str) and (ROOT / model).resolve() == model_dir.resolve():
            out.append(c.parent.name)
    return out


def warm_start(scale: str, out_dir: str, dry_run: bool) -> list[str]:
    """["--model", <out_dir>/warm-model] for a WARM scale, after making that model once with experiments/warmstart.py
    (skipped when its weights are there); [] for the other scales. Its weights are never committed, only
    warmstart.json (how it was made, the sha256 of its weights and the norms of its update), so a new checkout
    rebuilds them: into a sibling directory first, then kept if they are the recorded weights (same sha256:
    warmstart.py is deterministic on one kind of CPU), or equal to fp32 rounding (another CPU kind:
    warmstart.same_warm_start), or no run in `out_dir` has started from the recorded ones; otherwise SystemExit,
    since the runs of one protocol must share one starting point. The record of the first build stays (a
    rebuild's is kept beside it, and its sha256 / update norms are added to a record that had none)."""
    if scale not in WARM:
        return []
    d = Path(out_dir) / "warm-model"
    turns = flag_value(SCALES[scale], "--max-turns", "3")
    tokens = flag_value(SCALES[scale], "--max-new-tokens", "48")
    cmd = [sys.executable, "experiments/warmstart.py", str(d), *WARM[scale], "--max-turns", turns,
           "--max-new-tokens", tokens]
    done = (ROOT / d / "model.safetensors").exists()                 # ROOT / d is d itself when d is absolute
    print(("# done: " if done else "") + " ".join(shlex.quote(c) for c in cmd), flush=True)
    if done or dry_run:
        return ["--model", str(d)]
    record = ROOT / d / "warmstart.json"
    if not record.exists():
        subprocess.run(cmd, cwd=ROOT, check=True)
        return ["--model", str(d)]
    import warmstart
    old = json.loads(record.read_text())
    started = started_from(ROOT / d, ROOT / out_dir)
    rebuild, retired = d.with_name(d.name + ".rebuild"), d.with_name(d.name + ".old")
    shutil.rmtree(ROOT / rebuild, ignore_errors=True)
    subprocess.run([*cmd[:2], str(rebuild), *cmd[3:]], cwd=ROOT, check=True)
    new = json.loads((ROOT / rebuild / "warmstart.json").read_text())
    same = warmstart.same_warm_start(old, new)
    if not same and started:
        raise SystemExit(f"{d}: the rebuilt warm start (in {rebuild}) is not the one the runs {', '.join(started)} "
                         f"started from (sha256 {new['sha256'][:12]} vs {str(old.get('sha256'))[:12]}, and not equal "
                         f"to rounding either). Go on from the old weights where they are, or start over: delete "
                         f"{d} and those runs")
    if same:                                                         # keep the first record, and this one beside it
        os.replace(ROOT / rebuild / "warmstart.json", ROOT / rebuild / "warmstart-rebuild.json")
        fingerprint = {k: new[k] for k in ("sha256", "delta_norms") if k not in old}
        note = {"fingerprint": "sha256 / delta_norms added from a rebuild equal to rounding"} if fingerprint else {}
        (ROOT / rebuild / "warmstart.json").write_text(json.dumps({**old, **fingerprint, **note}, indent=2) + "\n")
    shutil.rmtree(ROOT / retired, ignore_errors=True)
    os.replace(ROOT / d, ROOT / retired)                             # never a moment without a record in d
    os.replace(ROOT / rebuild, ROOT / d)
    shutil.rmtree(ROOT / retired)
    print(f"# {d}: rebuilt, " + {"identical": "the recorded weights (same sha256)",
                                 "rounding": "the recorded weights up to fp32 rounding (norms and losses within "
                                             f"{warmstart.ROUNDING:g}; warmstart-rebuild.json has this build's record)",
                                 "": f"new weights (sha256 {new['sha256'][:12]}; no run had started from the "
                                     f"recorded ones)"}[same], flush=True)
    return ["--model", str(d)]


def agnostic_baseline(scale: str, extra: list[str], out_dir: str, dry_run: bool) -> str:
    """<out_dir>/agnostic.json: the best fixed move sequence on the validation maps (experiments/agnostic.py),
    computed once for the scale's --val-seed / --val-envs / --max-turns / --env-options; returns its path."""
    import agnostic
    import config
    flags = [*SCALES[scale], *extra]
    lo = int(flag_value(flags, "--val-seed", str(config.Args.val_seed)))
    n = int(flag_value(flags, "--val-envs", str(config.Args.val_envs)))
    options = {**json.loads(flag_value(flags, "--env-options", "{}")),
               "max_turns": int(flag_value(flags, "--max-turns", "3"))}
    path = ROOT / out_dir / AGNOSTIC                                  # as the runs: relative to the checkout
    command = (f"python experiments/agnostic.py --env frozenlake --seeds {lo}:{lo + n} "
               f"--env-options '{json.dumps(options)}'")
    old = json.loads(path.read_text()) if path.exists() else {}
    if old.get("command") != command and not dry_run:
        seq, wins, count = agnostic.best_fixed_sequence("frozenlake", range(lo, lo + n), options)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"env": "frozenlake", "env_options": options, "seeds": [lo, lo + n],
                                    "sequence": seq, "successes": wins, "instances": count,
                                    "success": wins / count, "command": command}, indent=2) + "\n")
    print(("# done: " if old.get("command") == command else "") + command, flush=True)
    return str(Path(out_dir) / AGNOSTIC)


def timed_run(cmd: list[str], run: str, out_dir: Path) -> None:
    """Run one train.py command and append its wall time (model load and checkpoints included) to
    <out_dir>/walltime.jsonl, so a protocol's cost is measured, not estimated; a resumed run adds a second line.
    A launch that ends otherwise (Ctrl-C, SIGTERM at a session's end: the driver turns it into SystemExit, train.py
    checkpoints and exits non-zero) still writes its line, marked "interrupted", so the part it ran is counted."""
    import time
    from runlog import cpu_info
    t0, ok = time.perf_counter(), False
    try:
        subprocess.run(cmd, cwd=ROOT, check=True)
        ok = True
    finally:
        with open(ROOT / out_dir / "walltime.jsonl", "a") as f:
            f.write(json.dumps({"run": run, "seconds": round(time.perf_counter() - t0, 1),
                                "resumed": "--resume" in cmd, **({} if ok else {"interrupted": True}),
                                "cpu": cpu_info(), "ended": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")


def entropy_base(scale: str, extra: list[str]) -> float:
    import config
    return float(flag_value([*SCALES[scale], *extra], "--entropy-coef", str(config.Args.entropy_coef)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=(
        "Any other flag is passed to every train.py run of the experiment, after the scale's flags, so it wins: "
        "e.g. `python experiments/paper.py classroom --seeds 0 --steps 4 --val-envs 8` (train.py --help lists them). "
        "`python experiments/paper.py list` shows every experiment with its arms."))
    ap.add_argument("experiment", choices=["list", "calibration", *EXPERIMENTS])
    ap.add_argument("--scale", choices=list(SCALES), default=None,
                    help="classroom for the classroom experiment, cpu for the others (default)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="default 0 1 2 (the referee's minimum); 0-5 for protocol (the paired sign-flip test "
                    "cannot reach p < 0.05 below 6)")
    ap.add_argument("--out-dir", default="", help="where the runs go (default: experiments/classroom for the "
                    "classroom protocol at its own scale, runs/ otherwise)")
    ap.add_argument("--page", default="", help="the Markdown page written at the end (default: experiments/RESULTS.md "
                    "for the classroom protocol at its own scale, <out-dir>/<experiment>.md otherwise)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    if (argv if argv is not None else sys.argv[1:])[:1] == ["calibration"]:   # no train.py runs: its own flags
        import calibration
        calibration.main((argv if argv is not None else sys.argv[1:])[1:])
        return
    args, extra = ap.parse_known_args(argv)       # anything else is passed to every train.py run
    if args.experiment == "list":
        for k, (what, arms, _) in EXPERIMENTS.items():
            print(f"{k:22s} {len(arms):2d} arms  {what}")
        print(f"{'calibration':22s}  -       the MI proxy on batches of known input dependence "
              "(experiments/calibration.py, no training)")
        return
    args.scale = args.scale or DEFAULT_SCALE.get(args.experiment, "cpu")
    args.seeds = args.seeds if args.seeds is not None else DEFAULT_SEEDS.get(args.experiment, [0, 1, 2])
    if args.scale == "smoke":
        args.scale = SMOKE_SCALE.get(args.experiment, "smoke")
    if args.experiment in SMOKE_SCALE and args.scale not in SMOKE_SCALE.values() and args.scale != "multiturn":
        ap.error(f"--scale {args.scale}: {args.experiment} is multi-turn FrozenLake from a warm start; use "
                 "--scale multiturn (default) or smoke")
    if args.experiment not in SCALE_FOR.get(args.scale, (args.experiment,)):
        ap.error(f"--scale {args.scale}: made for {', '.join(SCALE_FOR[args.scale])} only")
    home = args.experiment in HOME and args.scale == DEFAULT_SCALE[args.experiment]
    args.out_dir = args.out_dir or (HOME[args.experiment][0] if home else "runs")
    page = args.page or (HOME[args.experiment][1] if home else str(Path(args.out_dir) / f"{args.experiment}.md"))
    warm = warm_start(args.scale, args.out_dir, args.dry_run)
    baseline = (agnostic_baseline(args.scale, extra, args.out_dir, args.dry_run)
                if args.experiment == "multiturn" else "")
    todo = runs(args.experiment, args.scale, args.seeds, extra, args.out_dir, warm)
    for run, argv_run in todo:
        run_dir = Path(args.out_dir) / run
        done = (run_dir / "finished.json").exists()
        if "@diluted" in argv_run:
            seed = int(argv_run[argv_run.index("--seed") + 1])
            base = entropy_base(args.scale, extra)
            try:
                value = diluted_entropy(args.out_dir, args.experiment, seed, base)
            except SystemExit:                     # the filter run has not logged a kept fraction yet
                if not args.dry_run:
                    raise
                value = f"<{base:g} x kept fraction>"
            argv_run = [value if a == "@diluted" else a for a in argv_run]
        cmd = [sys.executable, "train.py", *argv_run]
        if (run_dir / "config.json").exists() and not done:
            cmd = [sys.executable, "train.py", "--resume", str(run_dir)]
        print(("# done: " if done else "") + " ".join(shlex.quote(c) for c in cmd), flush=True)
        if not args.dry_run and not done:
            timed_run(cmd, run, Path(args.out_dir))
    report_cmd = [sys.executable, "report.py", *[str(Path(args.out_dir) / r) for r in page_runs(args.experiment, todo,
                                                                                               args.out_dir)],
                  *report_flags(args.experiment, page, intro=home),
                  *(["--baseline", baseline] if baseline else []),
                  *(["--missing-ok"] if args.scale in ("smoke", *SMOKE_SCALE.values()) else [])]
    print(" ".join(shlex.quote(c) for c in report_cmd), flush=True)
    if not args.dry_run:
        subprocess.run(report_cmd, cwd=ROOT, check=True)


def page_runs(experiment: str, todo: list, out_dir: str) -> list[str]:
    """The runs a page summarises: this invocation's, and every finished run of the same experiment's arms already in
    `out_dir` (so `--seeds 1` after `--seeds 0` keeps seed 0 on the page), in arm order, then by seed."""
    arms = list(EXPERIMENTS[experiment][1])

    def arm_seed(name):                                  # "<experiment>-<arm>-s<seed>" -> (arm, "seed")
        arm, _, seed = name[len(experiment) + 1:].rpartition("-s")
        return arm, seed
    names = {r for r, _ in todo}
    for d in Path(out_dir).glob(f"{experiment}-*-s*"):
        arm, seed = arm_seed(d.name)
        if arm in arms and seed.isdigit() and (d / "finished.json").exists():
            names.add(d.name)
    return sorted(names, key=lambda n: (arms.index(arm_seed(n)[0]), int(arm_seed(n)[1])))


def report_flags(experiment: str, page: str, intro: bool = True) -> list[str]:
    """report.py flags of one experiment's page (arms, diagnostics, paired differences, figure, and the
    hand-written experiments/<experiment>.md on top when `intro`)."""
    flags = ["--arm-by", EXPERIMENTS[experiment][2], "--page", page]
    spec = PAGES.get(experiment)
    if spec:
        flags += ["--columns", ",".join(spec["columns"]), "--figure-keys", ",".join(spec["figure"])]
        if spec["pairs"]:                    # (an empty --pairs '' would print a command that does not rerun)
            flags += ["--pairs", ",".join(f"{experiment}-{a}:{experiment}-{b}" for a, b in spec["pairs"])]
    else:
        flags += ["--spearman", "mi_first_turn/mi_zscore_ema"]
    if experiment in ("classroom", "regime_search", "protocol") and CALIBRATION.exists():   # its batches on the regime map
        flags += ["--calibration", str(CALIBRATION.relative_to(ROOT))]
    elif experiment in ("multiturn", "slip_boundary"):                   # the calibration batches are the Bandit's
        flags += ["--regime-map"]
    path = Path(__file__).parent / f"{experiment}.md"
    if intro and path.exists():
        flags += ["--intro", str(path.relative_to(ROOT))]
    return flags


if __name__ == "__main__":
    import signal
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))   # timed_run records the part run
    main()
