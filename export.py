"""Export a training run as a Hugging Face model directory that `AutoModelForCausalLM.from_pretrained` loads.

What it implements: `load_run(run_dir)` rebuilds the policy of a run exactly as `train.py --resume` would (the run's
config.json: --model, --seed for the tiny model, --chat-template, --lora-*; then the checkpoint's tensors through
policy.load_checkpoint_state: the whole state dict, or under LoRA only the adapters on the re-loaded base), and
`export(run_dir, out_dir)` saves it with transformers' / peft's own `save_pretrained`:

    out_dir/config.json, model.safetensors      the weights (LoRA adapters merged into the base: peft merge_and_unload)
    out_dir/tokenizer*.json, chat_template.jinja the tokenizer with the chat template the run trained with
    out_dir/generation_config.json              eos / pad ids, sampling at the run's validation temperature
    out_dir/nanoragen_export.json               where it came from: run, step, model, env, chat template

`--adapter` (LoRA runs): a peft adapter directory instead (adapter_config.json + adapter_model.safetensors, plus the
tokenizer and generation config); `from_pretrained` loads the base named in adapter_config.json (the HF id or local
path of --model; the SmolLM2 float cache for smollm2-135m; for the random `tiny` model the base is saved in
out_dir/base/ and named by its absolute path) and applies the adapter.

Leaves out: the PPO critic and optimizer states (training state, not part of the policy), dtype conversion
(weights stay fp32, as trained), uploading to the hub (`huggingface-cli upload out_dir ...` does that).

Run: `python export.py runs/<name> exported/<name> [--adapter] [--checkpoint prev]`;
     `python evaluate.py exported/<name> --env ...` then evaluates it (evaluate.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import config
import policy

EXPORT_INFO = "nanoragen_export.json"


def checkpoint_path(run_dir: Path, which: str = "last") -> Path:
    """checkpoints/<which>/rank0.pt (rank 0 holds the whole policy: DDP replicas are equal, FSDP2 checkpoints are
    gathered onto rank 0)."""
    return Path(run_dir) / "checkpoints" / which / "rank0.pt"


def run_args(run_dir) -> config.Args:
    """The run's resolved flags (config.json), validated as on --resume; ValueError (one line) if it is not a run."""
    if not (Path(run_dir) / "config.json").is_file():
        raise ValueError(f"{run_dir}: no config.json there (not a nanoRAGEN run directory)")
    args, _ = config.resolve([], base_run=str(run_dir))
    return args


def load_run(run_dir, *, device="cpu", which: str = "last", args: config.Args | None = None):
    """(model, tokenizer, args, step): the policy of `run_dir` at its checkpoint `which` (last | prev), in eval mode.
    A LoRA run comes back as the peft model (adapters not merged). ValueError (one line) when something is missing.
    args: the run's flags with overrides (evaluate.py: --chat-template); default: config.json as it is."""
    import train                                   # deferred: train.py imports most of the project

    run_dir = Path(run_dir)
    args = run_args(run_dir) if args is None else args
    path = checkpoint_path(run_dir, which)
    if not path.is_file():
        raise ValueError(f"{run_dir}: no checkpoint at {path} (a run writes one every --save-every steps and at its "
                         "end)")
    model, tok = train.load_policy(args, device)
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    lora = bool(ckpt.get("lora", False))
    if lora != bool(args.lora_rank):
        raise ValueError(f"{path} was written {'with' if lora else 'without'} LoRA but config.json says --lora-rank "
                         f"{args.lora_rank}")
    if lora:
        model = policy.add_lora(model, args.lora_rank, args.lora_alpha, args.lora_targets)
    policy.load_checkpoint_state(model, ckpt["model"], lora)
    return model.to(device).eval(), tok, args, int(ckpt["step"])


def generation_config(model, tok, args):
    """Sampling as the run validated: do_sample at --val-temperature, --max-new-tokens per reply, eos + pad ids."""
    from transformers import GenerationConfig

    gc = GenerationConfig.from_model_config(model.config)
    eos = [i for i in {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")} if isinstance(i, int) and i >= 0
           and i != tok.unk_token_id]
    gc.update(do_sample=True, temperature=args.val_temperature, top_p=1.0, max_new_tokens=args.max_new_tokens,
              eos_token_id=sorted(eos) if len(eos) > 1 else eos[0], pad_token_id=tok.pad_token_id)
    return gc


def _base_reference(args, out_dir: Path) -> str:
    """What adapter_config.json names as the base: a name or path that from_pretrained can load."""
    if args.model == "smollm2-135m":
        return str(policy.smollm2_dir())
    if args.model == "tiny":                       # random weights, no name loads them: ship the base alongside
        policy.load("tiny", seed=args.seed)[0].save_pretrained(out_dir / "base")
        return str((out_dir / "base").resolve())
    return str(Path(args.model).expanduser().resolve()) if Path(args.model).expanduser().is_dir() else args.model


def check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValueError(f"{out_dir} exists and is not empty; choose another output directory")


def export(run_dir, out_dir, *, adapter: bool = False, which: str = "last") -> Path:
    """Write the run's policy to `out_dir` (see the module docstring); every check runs before anything is written."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    args = run_args(run_dir)
    check_out_dir(out_dir)
    if adapter and not args.lora_rank:
        raise ValueError(f"--adapter: {run_dir} is a full fine-tuning run (--lora-rank 0); it has no adapter to save")
    model, tok, args, step = load_run(run_dir, which=which)
    out_dir.mkdir(parents=True, exist_ok=True)
    gc = generation_config(model, tok, args)
    if policy.is_lora(model) and adapter:
        model.peft_config["default"].base_model_name_or_path = _base_reference(args, out_dir)
        model.save_pretrained(out_dir)             # adapter_config.json + adapter_model.safetensors
    else:
        if policy.is_lora(model):
            model = model.merge_and_unload()      # W + alpha/r * B A, the plain transformers model again
        model.generation_config = gc
        model.save_pretrained(out_dir)
    gc.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)                   # tokenizer files + the chat template (--chat-template included)
    info = {"run": str(run_dir), "checkpoint": which, "step": step, "model": args.model, "env": args.env,
            "env_options": args.env_options, "chat_template": args.chat_template or "(the tokenizer's own)",
            "lora": bool(args.lora_rank), "format": "peft adapter" if adapter else "merged LoRA weights" if args.lora_rank else "full weights"}
    (out_dir / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return out_dir


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description="Export a nanoRAGEN run's checkpoint as a Hugging Face model directory.")
    ap.add_argument("run", help="run directory, e.g. runs/demo")
    ap.add_argument("out_dir", help="new (or empty) output directory")
    ap.add_argument("--adapter", action="store_true", help="LoRA runs: save the peft adapter instead of merged weights")
    ap.add_argument("--checkpoint", choices=["last", "prev"], default="last", help="which checkpoint [last]")
    a = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()              # save_pretrained's one-shard progress bar
    try:
        out = export(a.run, a.out_dir, adapter=a.adapter, which=a.checkpoint)
    except ValueError as e:                        # config.UsageError included: one line, exit 2
        ap.exit(2, f"error: {e}\n")
    info = json.loads((out / EXPORT_INFO).read_text())
    print(f"{out}: {info['format']} of {a.run} at step {info['step']} (model {info['model']}); load with "
          f"AutoModelForCausalLM.from_pretrained({str(out)!r})", file=sys.stdout)
    return out


if __name__ == "__main__":
    main()
