"""export.py: a run's checkpoint becomes a Hugging Face directory that AutoModelForCausalLM.from_pretrained loads
and that scores a batch with the same token log-probs as the checkpoint (full fine-tuning, LoRA merged, LoRA as a
peft adapter); the chat template and generation config travel with it; bad requests are refused before writing.
Run: .venv/bin/python -m pytest tests/test_export.py -q   (tiny model, ~1 min)
"""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import export
import policy
import train

RUN = ["--preset", "smoke", "--env", "bandit", "--filter", "none", "--steps", "1", "--eval-every", "0",
       "--mi-every", "0", "--lr", "1e-2", "--no-progress"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    full = train.main([*RUN, "--out-dir", str(out), "--name", "full", "--chat-template", "chatml"])
    lora = train.main([*RUN, "--out-dir", str(out), "--name", "lora", "--lora-rank", "4"])
    return full, lora


def batch(tok):
    texts = ["<|im_start|>user\nPick Left or Right.<|im_end|>\n<|im_start|>assistant\n<think>left</think>",
             "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<answer>Right</answer><|im_end|>"]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    mask = enc["attention_mask"].clone()
    mask[:, 0] = 0
    return enc["input_ids"], enc["attention_mask"], mask


def logp(model, tok):
    with torch.no_grad():
        return policy.token_logprobs(model, *batch(tok))[0]


def test_full_run_round_trips_through_from_pretrained(runs, tmp_path):
    full, _ = runs
    trained, tok, args, step = export.load_run(full)
    out = export.export(full, tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    loaded_tok = AutoTokenizer.from_pretrained(out)
    assert step == 1 and torch.equal(logp(loaded, loaded_tok), logp(trained, tok))    # exact: fp32 weights
    initial = policy.load("tiny", seed=args.seed)[0]
    assert not torch.equal(logp(initial, tok), logp(trained, tok))                    # it did train
    assert loaded_tok.chat_template == policy.CHATML                                  # --chat-template chatml
    gc = json.loads((out / "generation_config.json").read_text())
    assert gc["temperature"] == args.val_temperature and gc["do_sample"] is True
    eos = gc["eos_token_id"] if isinstance(gc["eos_token_id"], list) else [gc["eos_token_id"]]
    assert loaded_tok.convert_tokens_to_ids("<|im_end|>") in eos                      # the end-of-turn token stops it
    info = json.loads((out / export.EXPORT_INFO).read_text())
    assert (info["step"], info["format"], info["model"]) == (1, "full weights", "tiny")


def test_lora_run_merged_and_as_adapter_give_the_checkpoint_logprobs(runs, tmp_path):
    _, lora = runs
    trained, tok, _, _ = export.load_run(lora)
    assert policy.is_lora(trained)
    want = logp(trained, tok)
    merged = AutoModelForCausalLM.from_pretrained(export.export(lora, tmp_path / "merged")).eval()
    assert not any("lora" in k for k in merged.state_dict())
    torch.testing.assert_close(logp(merged, tok), want, atol=1e-5, rtol=1e-5)
    adapter_dir = export.export(lora, tmp_path / "adapter", adapter=True)
    assert (adapter_dir / "adapter_config.json").is_file() and not (adapter_dir / "model.safetensors").exists()
    adapted = AutoModelForCausalLM.from_pretrained(adapter_dir).eval()               # base + adapter through peft
    torch.testing.assert_close(logp(adapted, tok), want, atol=1e-5, rtol=1e-5)
    base_logp = logp(policy.load("tiny", seed=0)[0], tok)
    assert (want - base_logp).abs().max() > 1e-4                                      # the adapter matters


def test_bad_exports_are_refused_before_writing(runs, tmp_path, capsys):
    full, lora = runs
    with pytest.raises(ValueError, match="--adapter.*full fine-tuning"):
        export.export(full, tmp_path / "a", adapter=True)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        export.export(lora, tmp_path / "busy")
    with pytest.raises(ValueError, match="config.json"):
        export.export(tmp_path, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with pytest.raises(SystemExit) as e:
        export.main([str(full), str(tmp_path / "busy")])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
