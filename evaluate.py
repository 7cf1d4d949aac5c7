"""Evaluate a policy on an environment without training: a run's checkpoint, an exported directory, or a model name.

What it implements (the validation of train.py, on any seeds): `evaluate(source, ...)` rolls out one episode per
seed (or `--group-size` G per seed) with rollout.rollout at `--temperature`, and writes one JSON with
    metrics    rollout.rollout_metrics: success, return, env_reward, penalty, format / valid-action rates per turn
               (`format_ok`, `valid_action`), `turns`, `num_actions`, generated tokens, end reasons
    mi         the MI proxy (mi_proxy.mi_report, both families, scored by the evaluated policy) with `--mi`
    samples    the first `--samples` trajectories in full (chat text, actions, return)
    setup      source, checkpoint step, env + options, seeds, temperature, max tokens/turns, chat template
SOURCE is
    runs/<name>        a run directory: its checkpoint (export.load_run: --model, LoRA, --chat-template as trained),
                       its env, options and token limits unless given here; writes runs/<name>/eval-<tag>.json
    a directory        e.g. made by export.py: loaded with from_pretrained; writes <dir>/eval-<tag>.json
    a model name       smollm2-135m, tiny, or a Hugging Face id; writes ./eval-<name>-<tag>.json
(`--out PATH` writes elsewhere). It never touches a run's metrics.jsonl / samples.jsonl: an evaluation is not a
training step. Every flag is checked (by config.validate, as train.py's) before the model loads, and an existing
output file is refused unless --overwrite.

Leaves out: several processes (one process rolls out every seed; --groups batching in train.py), the
frozen-scorer and permutation-null controls of the MI proxy (train.py --mi-scorer / --mi-null).

Run: python evaluate.py runs/<name> --seeds 5000:5064 --temperature 0.5 [--mi]
     python evaluate.py exported/<name> --env sokoban --seeds 0:32
     python evaluate.py smollm2-135m --env bandit --seeds 123 --episodes 64
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

import config
import export
import mi_proxy
import rollout
import runlog


def parse_seeds(text: str, episodes: int | None) -> list[int]:
    """`A:B` -> A..B-1; `A` -> A..A+episodes-1 (64 by default); ValueError naming --seeds otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text or "")
    if m is None:
        raise config.UsageError(f"--seeds: expected START:END (END exclusive) or START, got {text!r}")
    a = int(m.group(1))
    if m.group(2) is not None:
        b = int(m.group(2))
        if episodes is not None and episodes != b - a:
            raise config.UsageError(f"--episodes {episodes} disagrees with --seeds {text} ({b - a} seeds)")
    else:
        b = a + (64 if episodes is None else episodes)
    if b <= a:
        raise config.UsageError(f"--seeds: the range {a}:{b} is empty (END is exclusive and must exceed START)")
    return list(range(a, b))


def source_kind(source: str) -> str:
    """run (a directory with config.json + checkpoints/) | dir (a model directory) | name (built-in or HF id)."""
    p = Path(source).expanduser()
    if (p / "config.json").is_file() and (p / "checkpoints").is_dir():
        return "run"
    return "dir" if p.is_dir() else "name"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def env_tag(env: str) -> str:
    """A short file-name-safe name of an env: `sokoban`, or `my_env.MyEnv` for path/to/my_env.py:MyEnv."""
    module, sep, cls = env.rpartition(":")
    return _slug(f"{Path(module).stem}.{cls}" if sep else env)


def resolve_source(source: str, flags: list, *, seed: int = 0, checkpoint: str = "last"):
    """(args, kind) of a policy SOURCE (a run directory, a model directory, a model name) with train.py override
    flags (`--env`, `--val-temperature`, `--max-new-tokens`, ...), validated by config.resolve as train.py does, before
    any model loads. A run brings its own flags (config.json) and needs its checkpoint; other sources need `--env`
    and sample at --val-temperature 0.5 unless it is given. config.UsageError (one line) otherwise. Shared by
    evaluate.py and `python envs.py ENV --play --agent SOURCE`."""
    kind = source_kind(source)
    flags = list(flags)
    if kind == "run":
        base = str(Path(source).expanduser())
    else:
        if "--env" not in flags:
            raise config.UsageError(f"--env: required when SOURCE is not a run directory ({source!r})")
        base = ""
        flags += ["--model", str(Path(source).expanduser()) if kind == "dir" else source]
    flags += ["--mi-every", "0", "--filter", "none", "--seed", str(seed)]   # evaluation: no filter, no train MI
    try:
        args, _ = config.resolve(flags, base_run=base)
    except SystemExit:
        raise config.UsageError("a flag was refused (see above)") from None
    if "--val-temperature" not in flags and kind != "run":
        args.val_temperature = 0.5
    if kind == "run" and not export.checkpoint_path(Path(base), checkpoint).is_file():
        raise config.UsageError(f"{source}: no checkpoint at {export.checkpoint_path(Path(base), checkpoint)}")
    return args, kind


def plan(argv=None):
    """Parse and check everything that can fail before a model loads. Returns (opts, args, seeds, kind, out path)."""
    ap = argparse.ArgumentParser(description="Evaluate a run, an exported model directory or a model name on an "
                                 "environment's seeds, without training (writes one JSON).")
    ap.add_argument("source", help="runs/<name> | a model directory (export.py) | smollm2-135m | tiny | owner/name")
    ap.add_argument("--env", help="environment (default: the run's; required otherwise): a built-in name or "
                    "module:Class / path/to/file.py:Class")
    ap.add_argument("--env-options", help="JSON dict of environment options (default: the run's with its "
                    "--val-env-options merged over them, i.e. its validation envs; else {})")
    ap.add_argument("--seeds", default="", help="START:END (END exclusive) or START with --episodes; default: the "
                    "run's validation seeds (--val-seed, --val-envs)")
    ap.add_argument("--episodes", type=int, help="number of seeds when --seeds gives only START [64]")
    ap.add_argument("--group-size", type=int, default=1, help="episodes per seed [1]")
    ap.add_argument("--temperature", type=float, help="sampling temperature (default: the run's --val-temperature, "
                    "else 0.5)")
    ap.add_argument("--max-new-tokens", type=int, help="token cap per turn (default: the run's)")
    ap.add_argument("--max-turns", type=int, help="turns per episode, 0 = the env's (default: the run's)")
    ap.add_argument("--max-context", type=int, help="context cap in tokens (default: the run's)")
    ap.add_argument("--chat-template", help="'' | chatml | a Jinja file (default: the run's)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 sampling where the hardware has it (train.py --bf16); default: the run's, else on")
    ap.add_argument("--checkpoint", choices=["last", "prev"], default="last", help="run sources: which checkpoint")
    ap.add_argument("--mi", action="store_true", help="also compute the MI proxy on the evaluation batch")
    ap.add_argument("--mi-samples", type=int, default=64, help="(x, z) pairs per MI family [64]")
    ap.add_argument("--samples", type=int, default=4, help="trajectories written in full [4]")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed [0]")
    ap.add_argument("--tag", default="", help="name of the result: eval-<tag>.json (default from env/seeds/temp)")
    ap.add_argument("--out", default="", help="write the JSON here instead")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing result file")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    o = ap.parse_args(argv)
    flags = []                                      # train.py flags: config.resolve validates them as train.py does
    for name in ("env", "env_options", "max_new_tokens", "max_turns", "max_context", "chat_template"):
        v = getattr(o, name)
        if v is not None:
            flags += [f"--{name.replace('_', '-')}", str(v)]
    if o.temperature is not None:
        flags += ["--val-temperature", str(o.temperature)]
    if o.bf16 is not None:
        flags += ["--bf16" if o.bf16 else "--no-bf16"]
    args, kind = resolve_source(o.source, flags, seed=o.seed, checkpoint=o.checkpoint)
    if o.env_options is None:                        # a run's own validation envs (e.g. the Bandit's test split)
        args.env_options = json.dumps({**json.loads(args.env_options), **json.loads(args.val_env_options)})
    seeds = (parse_seeds(o.seeds, o.episodes) if o.seeds else
             list(range(args.val_seed, args.val_seed + (o.episodes or args.val_envs))))
    if o.group_size < 1:
        raise config.UsageError(f"--group-size: must be >= 1, got {o.group_size}")
    if o.mi and not args.think:
        raise config.UsageError("--mi: the MI proxy needs reasoning, but the run was trained with --no-think")
    if o.mi and o.mi_samples < 2:
        raise config.UsageError(f"--mi-samples: needs >= 2 pairs, got {o.mi_samples}")
    if o.samples < 0:
        raise config.UsageError(f"--samples: must be >= 0, got {o.samples}")
    tag = o.tag or f"{env_tag(args.env)}-{seeds[0]}-{seeds[-1] + 1}-t{args.val_temperature:g}"
    out = Path(o.out) if o.out else (Path(o.source).expanduser() / f"eval-{tag}.json" if kind != "name" else
                                     Path(f"eval-{_slug(o.source)}-{tag}.json"))
    if out.exists() and not o.overwrite:
        raise config.UsageError(f"{out} exists: pass --overwrite to replace it, or --tag / --out")
    return o, args, seeds, kind, out


def load_policy(o, args, kind: str, device):
    """(model, tokenizer, checkpoint step or None) of the parsed command line `o` (o.source, o.checkpoint)."""
    return load_source(o.source, args, kind, device, o.checkpoint)


def load_source(source: str, args, kind: str, device, checkpoint: str = "last"):
    """(model, tokenizer, checkpoint step or None) for resolve_source's (args, kind): a run's checkpoint
    (export.load_run), else train.load_policy (a model directory or name)."""
    import train
    if kind == "run":
        model, tok, _, step = export.load_run(Path(source).expanduser(), device=device, which=checkpoint, args=args)
        return model, tok, step
    model, tok = train.load_policy(args, device)
    return model, tok, None


@torch.no_grad()
def evaluate(model, tok, args, seeds, group_size: int = 1, *, mi: bool = False, mi_samples: int = 64,
             n_samples: int = 4, seed: int = 0) -> dict:
    """Roll out `group_size` episodes per seed at args.val_temperature; metrics, optional MI proxy, samples."""
    import train
    torch.manual_seed(seed)
    rcfg = train.rollout_config(args)
    rcfg = dataclasses.replace(rcfg, temperature=args.val_temperature, top_p=rcfg.val_top_p)
    t0 = time.perf_counter()
    trajs = rollout.rollout(model, tok, rcfg, seeds, group_size)
    ends = [t.end_reason for t in trajs]
    res = {"metrics": rollout.rollout_metrics(trajs), "end_reasons": {r: ends.count(r) for r in sorted(set(ends))},
           "time_rollout_s": time.perf_counter() - t0}
    if mi:
        rng = np.random.default_rng(seed)
        res["mi"] = {fam: mi_proxy.mi_report(model, trajs, family=fam, num_samples=mi_samples, rng=rng, ema=None,
                                             temperature=args.val_temperature)
                     for fam in mi_proxy.FAMILIES}
    res["samples"] = [{**r, "end_reason": t.end_reason, "turns": len(t.turns)}
                      for r, t in zip(train.sample_records(trajs[::group_size], n_samples), trajs[::group_size])]
    return res


def _jsonable(v):
    """runlog._plain through dicts and lists (NaN -> null, tensors / numpy scalars -> numbers)."""
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return runlog._plain(v)


def main(argv=None) -> Path:
    try:
        o, args, seeds, kind, out = plan(argv)
        device = "cpu" if o.cpu or not torch.cuda.is_available() else "cuda"
        model, tok, step = load_policy(o, args, kind, device)
    except ValueError as e:                          # config.UsageError included: one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    res = evaluate(model, tok, args, seeds, o.group_size, mi=o.mi, mi_samples=o.mi_samples, n_samples=o.samples,
                   seed=o.seed)
    setup = {"source": o.source, "kind": kind, "checkpoint": o.checkpoint if kind == "run" else None, "step": step,
             "model": args.model, "env": args.env, "env_options": json.loads(args.env_options),
             "seeds": [seeds[0], seeds[-1] + 1], "episodes": len(seeds) * o.group_size, "group_size": o.group_size,
             "temperature": args.val_temperature, "max_new_tokens": args.max_new_tokens,
             "max_turns": args.max_turns, "max_context": args.max_context, "think": args.think,
             "chat_template": args.chat_template, "bf16": args.bf16, "seed": o.seed, "commit": runlog.git_commit()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_jsonable({"setup": setup, **res}), indent=1) + "\n")
    m = res["metrics"]
    mi = (f", MI-Est {res['mi']['first_turn'].get('mi_estimate', float('nan')):.3f}" if o.mi else "")
    print(f"{o.source} on {args.env} seeds {seeds[0]}:{seeds[-1] + 1} (x{o.group_size}, T={args.val_temperature:g}): "
          f"success {m['success']:.3f}, format {m['format_ok_rate']:.3f}, valid actions {m['valid_action_rate']:.3f}, "
          f"turns {m['turns']:.2f}"
          f"{mi}; wrote {out}")
    return out


if __name__ == "__main__":
    main()
