"""Precision: one owner (policy.autocast, --bf16 / $NANORAGEN_BF16), the bf16 path's own invariants with measured
tolerances, the MI proxy in fp32 by default, and accelerate's mixed precision refused.

The suite runs on CPUs with and without native bf16, and both ways on each (`NANORAGEN_BF16=0 make test`,
`NANORAGEN_BF16=1 make test`, README "Tests"): every test that checks exactness pins fp32 itself; the tests here
force bf16 (`bf16=True`, emulated where the CPU has none), so they check the bf16 path on every CPU.

Tolerances are measured on the tiny model (2 layers, hidden 64) on an AMD EPYC with AVX512-BF16 (torch 2.13 CPU):
rollout log-probs vs their bf16 recomputation 7e-5 mean / 1e-3 max (vs an fp32 recomputation 4e-4 / 1.5e-3);
KV reuse vs re-encoding 5e-4 max, same samples; chunked vs one-call generate 0 (same samples:
tests/test_rollout.py::test_dropping_finished_rows_changes_no_sample[True-0.001]). On SmolLM2 bf16
sampled vs recomputed log-probs differ by ~0.02 mean / 0.22 max (the samples are slightly off-policy), which is why
the update recomputes old log-probs under the same autocast state as its own forward (first ratio exactly 1).
"""
import functools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import config
import distributed
import filter as rvfilter
import mi_metrics as mm
import mi_proxy as mp
import policy
import rollout
import sampling
import train
import update as upd
from rollout import RolloutConfig
from test_rollout import check_invariants
from test_train import OneProcess, scripted_batch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny():
    return policy.load("tiny", seed=0)


def test_bf16_default_follows_the_hardware_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv(policy.BF16_ENV, raising=False)
    assert policy.bf16_default("cpu") == policy.bf16_supported("cpu")
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    for env, want in (("0", torch.float32), ("1", torch.bfloat16)):
        monkeypatch.setenv(policy.BF16_ENV, env)
        with policy.autocast("cpu"):
            assert (x @ w).dtype == want
        with policy.autocast("cpu", enabled=False):                 # an explicit choice beats the environment
            assert (x @ w).dtype == torch.float32
    monkeypatch.setenv(policy.BF16_ENV, "yes")
    with pytest.raises(ValueError, match="NANORAGEN_BF16 must be 0 or 1"):
        policy.autocast("cpu")
    args, _ = config.resolve(["--no-bf16"])
    assert config.bf16(args) is False and config.mi_bf16(args) is False
    args, _ = config.resolve([])
    assert config.bf16(args) is None and config.mi_bf16(args) is False      # MI: fp32 unless asked
    args, _ = config.resolve(["--mi-precision", "train"])
    assert config.mi_bf16(args) is None


def test_bf16_rollout_masks_and_logprobs_within_measured_tolerance(tiny):
    """A bf16 rollout keeps every token-level invariant; its sampled log-probs equal a bf16 recomputation on the
    training tensors within 1e-2 (measured 1e-3 max), and KV reuse gives the same samples as re-encoding (with each
    row's own copy of its prompt: a prompt shared by the group rounds differently in bf16, see test_policy.py)."""
    model, tok = tiny
    torch.manual_seed(0)
    cfg = RolloutConfig(env="frozenlake", max_new_tokens=8, max_turns=2, bf16=True)
    trajs = rollout.rollout(model, tok, cfg, [10, 11], 2)
    for tr in trajs:
        check_invariants(tr, tok)
    t = rollout.to_tensors(trajs, pad_id=tok.pad_token_id)
    with torch.no_grad(), policy.autocast("cpu", enabled=True):
        logp, _ = policy.token_logprobs(model, t["input_ids"], t["attention_mask"], t["loss_mask"])
    for b, tr in enumerate(trajs):
        sampled = torch.tensor([x for turn in tr.turns for x in turn.gen_logp])
        assert torch.allclose(logp[b][t["loss_mask"][b] == 1], sampled, atol=1e-2)
    torch.manual_seed(0)
    trajs = rollout.rollout(model, tok, cfg, [10, 11], 2, generate_fn=functools.partial(sampling.generate,
                                                                                        share_prompts=False))
    torch.manual_seed(0)
    plain = rollout.rollout(model, tok, RolloutConfig(env="frozenlake", max_new_tokens=8, max_turns=2,
                                                      reuse_kv=False, bf16=True), [10, 11], 2)
    assert [tr.input_ids for tr in plain] == [tr.input_ids for tr in trajs]
    for tr, ref in zip(plain, trajs):
        for a, b in zip(tr.turns, ref.turns):
            assert a.gen_logp == pytest.approx(b.gen_logp, abs=1e-2)      # measured 5e-4


@pytest.mark.parametrize("bf16", ["0", "1"])
def test_first_ppo_ratio_is_exactly_one_in_either_precision(tiny, monkeypatch, bf16):
    """With lr 0 (the optimizers below) the policy never moves, so every micro-batch's ratio must be exactly 1 (|logp - old| == 0): the
    old-log-prob pass and the update's forward run under the same autocast state, fp32 or bf16."""
    monkeypatch.setenv(policy.BF16_ENV, bf16)
    model, tok = tiny
    args, _ = config.resolve(["--model", "tiny", "--algo", "ppo", "--groups", "2", "--group-size", "3",
                              "--mini-batch", "2", "--micro-batch", "2", "--filter", "none"])
    trajs, R = scripted_batch(tok, [[(" Left", 1.0), (" Right", 0.0), (" Up", 0.5)],
                                    [(" Down", 0.2), (" Right", 0.0), (" Left Left", 0.7)]])
    fres = rvfilter.apply_filter(R, config.filter_config(args))
    critic = policy.make_critic(model)
    batch = upd.prepare_batch(trajs, R, torch.zeros(2, dtype=torch.long), fres, model, critic, None, tok, args,
                              train.Dist(OneProcess()))
    assert batch["old_logp"] is not None                                      # 3 mini-batches: a separate pass
    seen, real = [], upd.loss_terms

    def spy(logp, ent, old_logp, b, r, mask, a):
        seen.append(float((logp.detach() - old_logp).abs().max()))
        return real(logp, ent, old_logp, b, r, mask, a)
    monkeypatch.setattr(upd, "loss_terms", spy)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.0)
    copt = torch.optim.AdamW(critic.parameters(), lr=0.0, weight_decay=0.0)
    stats = upd.update(model, critic, opt, copt, batch, args, train.Dist(OneProcess()))
    assert len(seen) == 3 and seen == [0.0] * 3 and stats["train/clipfrac"] == 0.0


def test_mi_proxy_scores_in_fp32_by_default(tiny, monkeypatch):
    """mi_report without bf16= is the fp32 cross-scoring even where bf16 is the default ($NANORAGEN_BF16=1); bf16
    scoring (bf16=None/True, --mi-precision train) is a different number."""
    monkeypatch.setenv(policy.BF16_ENV, "1")
    model, _ = tiny
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, 40000, 20).tolist() for _ in range(4)]
    reasonings = [rng.integers(100, 40000, 12).tolist() for _ in range(8)]
    true_col, sig = list(np.arange(8) % 4), [tuple(p) for p in prompts]
    with policy.autocast("cpu", enabled=False):
        L_tok, L_seq = mp.cross_log_probs(model, prompts, reasonings)
    fp32 = mm.collapse_metrics(L_tok, L_seq, true_col, sig, lengths=[12] * 8)
    pairs = mp.Pairs(prompts=prompts, reasonings=reasonings, true_col=true_col, signatures=sig, num_total=8,
                     num_valid=8, valid_thinking_rate=1.0, group_of_row=true_col)
    kw = dict(family="first_turn", num_samples=8, rng=rng, ema=None, pairs=pairs)
    assert mp.mi_report(model, None, **kw)["mi_seq_estimate"] == fp32["mi_seq_estimate"]
    with policy.autocast("cpu", enabled=True):
        L16 = mp.cross_log_probs(model, prompts, reasonings)[1]
    assert not torch.equal(torch.as_tensor(L16), torch.as_tensor(L_seq))             # bf16 is a different scorer
    bf16 = mp.mi_report(model, None, bf16=True, **kw)
    assert bf16["mi_seq_estimate"] == pytest.approx(
        mm.collapse_metrics(L16 / 12.0, L16, true_col, sig, lengths=[12] * 8)["mi_seq_estimate"])


def test_accelerate_mixed_precision_is_refused(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    with pytest.raises(config.UsageError, match="mixed_precision=fp16 is refused"):
        distributed.make_accelerator(cpu=True)


@pytest.mark.slow
def test_accelerate_mixed_precision_is_refused_on_two_processes(tmp_path):
    """`accelerate launch --mixed_precision bf16` (ACCELERATE_MIXED_PRECISION=bf16) on 2 processes: a one-line refusal
    on stderr, a failed launch, nothing written; policy.autocast stays the only precision switch."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_MIXED_PRECISION": "bf16"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29590",
           str(ROOT / "train.py"), "--model", "tiny", "--env", "bandit", "--groups", "2", "--group-size", "2",
           "--steps", "1", "--cpu", "--no-progress", "--out-dir", str(tmp_path), "--name", "mp"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    # one line per process that got to print it (torchrun SIGTERMs the other once the first exits with 2)
    assert 1 <= len(lines) <= 2 and all("mixed_precision=bf16 is refused" in ln for ln in lines), res.stderr[-2000:]
    assert "distributed.py" not in res.stderr and not (tmp_path / "mp").exists()   # no traceback of ours
    # (torchrun itself prints a ChildFailedError traceback when a process exits non-zero)


def test_bf16_copy_for_sampling_follows_the_master_weights():
    """policy.bf16_copy: bf16 weights, fp32 buffers (RoPE frequencies), cached while the weights are unchanged and
    refreshed after an optimizer step; what the bf16 rollout samples with (sampling.sampling_model)."""
    model, tok = policy.load("tiny", seed=1)
    c = policy.bf16_copy(model)
    assert c is not model and all(p.dtype == torch.bfloat16 for p in c.parameters())
    assert [b.dtype for b in c.buffers()] == [b.dtype for b in model.buffers()] and len(list(c.buffers())) > 0
    assert policy.bf16_copy(model) is c                                           # unchanged: no new copy
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.tensor([tok.encode("Left Right Up")])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    assert policy.bf16_copy(model) is c
    for p16, p in zip(c.parameters(), model.parameters()):                       # refreshed from the new weights
        assert torch.equal(p16, p.detach().to(torch.bfloat16))
    assert sampling.sampling_model(model, "cpu", True) == (c, False)              # bf16: the copy, no autocast
    assert sampling.sampling_model(model, "cpu", False) == (model, False)
    half = model.to(torch.bfloat16)
    assert policy.bf16_copy(half) is half and sampling.sampling_model(half, "cpu", True) == (half, True)
