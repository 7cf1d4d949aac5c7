"""snr.py: RV buckets (the official code's bucket rule on a worked example), per-component gradient norms against an independent
full-logits computation, zero task gradient on zero-RV groups, the train.py hook and the probe CLI."""
import math

import sys
from pathlib import Path

import pytest
import torch

import config
import policy
import snr
import train
import update as upd
from test_train import OneProcess, scripted_batch       # tests/ is on sys.path (pytest's rootdir-less import mode)


# ---------------------------------------------------------------------------------------------------- buckets
def test_quantile_buckets_follow_the_reference_example():
    std = torch.tensor([0.5, 0.0, 0.3, 0.9, 0.1, 0.7, 0.2, 0.0])     # 8 groups, 6 buckets -> 1,1,1,1,1,3
    b = dict(snr.split_into_buckets(std, 6, "quantile"))
    assert list(b) == ["all"] + [f"bucket_{i}" for i in range(1, 7)]
    assert b["all"] == list(range(8))
    # ascending std, ties by lower index: 1 (0.0), 7 (0.0), 4, 6, 2, then the rest {0, 5, 3}
    assert [b[f"bucket_{i}"] for i in range(1, 6)] == [[1], [7], [4], [6], [2]]
    assert b["bucket_6"] == [0, 3, 5]
    three = dict(snr.split_into_buckets(std[:3], 6))                  # fewer groups than buckets: one each
    assert [three[k] for k in ("bucket_1", "bucket_2", "bucket_3")] == [[1], [2], [0]] and len(three) == 4


def test_fixed_rv_buckets_are_unit_std_intervals_and_skip_empty_ones():
    std = torch.tensor([0.2, 1.0, 4.99, 7.5, 0.0])
    b = dict(snr.split_into_buckets(std, mode="fixed_rv"))
    assert b == {"all": [0, 1, 2, 3, 4], "bucket_1": [0, 4], "bucket_2": [1], "bucket_5": [2], "bucket_6": [3]}


def test_bad_bucket_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="bucket mode"):
        snr.split_into_buckets(torch.zeros(3), 6, "deciles")
    with pytest.raises(ValueError, match="n_buckets"):
        snr.split_into_buckets(torch.zeros(3), 0)
    with pytest.raises(ValueError, match="--grad-analysis-every"):
        config.resolve(["--grad-analysis-every", "2", "--group-size", "1", "--filter", "none"])


# ------------------------------------------------------------------------------------------- gradient norms
def make_batch(tok, rows: int, seed: int):
    """Random [prompt | response] rows of different lengths (right padded), a response mask, random advantages."""
    g = torch.Generator().manual_seed(seed)
    T = 14
    ids = torch.randint(5, 400, (rows, T), generator=g)
    attn = torch.ones(rows, T, dtype=torch.long)
    mask = torch.zeros(rows, T, dtype=torch.long)
    for b in range(rows):
        end = T - b % 3                                              # ragged: padding at the end
        attn[b, end:] = 0
        ids[b, end:] = tok.pad_token_id
        mask[b, 6:end] = 1
    adv = torch.randn(rows, 1, generator=g).expand(rows, T) * mask
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": mask, "adv": adv.contiguous()}


def agg(x, mask, mode, norm_len):
    """The aggregation modes written out per sequence (independent of algos.agg_loss)."""
    if mode == "token-mean":
        return (x * mask).sum() / mask.sum()
    per_seq = [(x[b] * mask[b]).sum() / (mask[b].sum() if mode == "seq-mean-token-mean" else norm_len)
               for b in range(len(x)) if mask[b].sum() > 0]
    return sum(per_seq) / len(per_seq)


def full_logits_norms(model, ref, batch, rows, ent_coef, kl_coef, mode, norm_len):
    """Independent: full softmax over the vocabulary, one backward per component, aggregation written out.
    At ratio 1 the clipped surrogate's gradient is that of −A·logπ; k3's gradient is that of e^u − u − 1."""
    r = torch.tensor(rows)
    ids, attn, mask = batch["input_ids"][r], batch["attention_mask"][r], batch["loss_mask"][r][:, 1:].float()

    def token_stats(m):
        logits = m(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        lsm = torch.log_softmax(logits, -1)
        logp = lsm.gather(-1, ids[:, 1:, None])[..., 0]
        return logp, -(lsm.exp() * lsm).sum(-1)
    out = {}
    for name in ("task", "entropy", "kl", "reg"):
        model.zero_grad(set_to_none=True)
        logp, ent = token_stats(model)
        with torch.no_grad():
            ref_logp, _ = token_stats(ref)
        u = ref_logp - logp
        terms = {"task": agg(-batch["adv"][r][:, 1:] * logp, mask, mode, norm_len),
                 "entropy": -ent_coef * agg(ent, mask, mode, norm_len),
                 "kl": kl_coef * agg(u.exp() - u - 1, mask, mode, norm_len)}
        terms["reg"] = terms["entropy"] + terms["kl"]
        terms[name].backward()
        out[name] = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters()
                                  if p.grad is not None))                  # fp64: fp32 norms drift by ~3e-5
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_component_norms_match_an_independent_full_softmax_computation(mode):
    torch.manual_seed(0)
    model, tok = policy.load("tiny", seed=0)
    ref, _ = policy.load("tiny", seed=1)                             # a different reference: KL gradient != 0
    # coefficients chosen so that ‖g_ent‖ and ‖g_KL‖ are of the same size: reg then tells ‖e + k‖ from the rest
    args, _ = config.resolve(["--model", "tiny", "--algo", "grpo", "--loss-agg", mode, "--micro-batch", "2",
                              "--mini-batch", "4", "--entropy-coef", "1.0", "--kl-coef", "0.007", "--no-bf16",
                              "--max-new-tokens", "16"])
    batch = make_batch(tok, 5, seed=3)
    with torch.no_grad():
        batch["ref_logp"], _ = policy.token_logprobs(ref, batch["input_ids"], batch["attention_mask"],
                                                     batch["loss_mask"])
    rows = [0, 2, 3, 4]                                              # 4 rows in micro-batches of 2, ragged
    got = snr.component_grad_norms(model, batch, rows, args, train.Dist(OneProcess()))
    assert config.loss_norm_len(args) == 16 * 5                    # FrozenLake's 5 turns x 16 tokens
    want = full_logits_norms(model, ref, batch, rows, 1.0, 0.007, mode, config.loss_norm_len(args))
    assert set(got) == {"task", "entropy", "kl", "reg"}
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-4), k
    e, k = got["entropy"], got["kl"]
    assert 0.2 < e / k < 5                                           # comparable, so the next line can fail
    for wrong in (k, e, math.hypot(e, k), e + k):
        assert abs(got["reg"] - wrong) > 1e-3 * wrong
    assert all(p.grad is None for p in model.parameters())           # the training gradients are untouched


def test_zero_variance_groups_have_zero_task_gradient_but_keep_the_regulariser():
    """Paper §3: with group-normalised advantages a zero-RV group has A = 0, so only KL/entropy push on it."""
    import filter as rvfilter
    model, tok = policy.load("tiny", seed=0)
    args, _ = config.resolve(["--model", "tiny", "--algo", "grpo", "--groups", "3", "--group-size", "4",
                              "--filter", "none", "--micro-batch", "3", "--no-bf16"])
    trajs, R = scripted_batch(tok, [[(" Left", 0.0)] * 4,
                                       [(" Left", 1.0), (" Right", 0.0), (" Left", 1.0), (" Right", 0.0)],
                                       [(" Right", 0.5)] * 4])
    fres = rvfilter.apply_filter(R, rvfilter.FilterConfig(strategy="none"))
    dist = train.Dist(OneProcess())
    batch = upd.prepare_batch(trajs, R, torch.zeros(3, dtype=torch.long), fres, model, None, None, tok, args, dist)
    m = snr.bucket_report(model, batch, R, args, dist, n_buckets=3)
    zero = [b for b in ("bucket_1", "bucket_2", "bucket_3") if m[f"grad/{b}/std_mean"] == 0]
    assert len(zero) == 2 and m["grad/bucket_3/std_mean"] > 0
    for b in zero:
        assert m[f"grad/{b}/task"] == 0.0 and m[f"grad/{b}/entropy"] > 0
    assert m["grad/bucket_3/task"] > 0
    # `all` is the token-weighted mix of its buckets: its task norm lies strictly between 0 and bucket_3's
    assert 0 < m["grad/all/task"] < m["grad/bucket_3/task"]
    assert m["grad/all/groups"] == 3 and m["grad/bucket_3/trajs"] == 4


# --------------------------------------------------------------------------------------------- train / probe
def test_the_analysis_does_not_change_training_and_sees_dapo_first_round(tmp_path):
    import runlog
    common = ["--preset", "smoke", "--env", "bandit", "--algo", "dapo", "--groups", "2", "--group-size", "2",
              "--steps", "2", "--eval-every", "0", "--mi-every", "0", "--kl-coef", "0.01", "--out-dir", str(tmp_path),
              "--no-progress"]
    a = train.main(common + ["--name", "plain"])
    b = train.main(common + ["--name", "probed", "--grad-analysis-every", "1"])
    pa, pb = runlog.load_checkpoint(a)["model"], runlog.load_checkpoint(b)["model"]
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    ra, rb = runlog.read_metrics(a), runlog.read_metrics(b)
    for x, y in zip(ra, rb):
        assert {k: v for k, v in x.items() if not k.startswith("time/")} == \
            {k: v for k, v in y.items() if not k.startswith(("time/", "grad/"))}
    assert rb[0]["grad/all/groups"] == 2 and "grad/all/kl" in rb[0]    # DAPO: round 0, zero-RV groups included


def test_train_logs_bucket_norms_and_the_probe_reads_a_run(tmp_path, capsys):
    d = train.main(["--preset", "smoke", "--env", "bandit", "--algo", "grpo", "--groups", "4", "--group-size", "2",
                    "--filter", "none", "--steps", "2", "--grad-analysis-every", "2", "--grad-buckets", "2",
                    "--eval-every", "0", "--mi-every", "0", "--out-dir", str(tmp_path), "--name", "g", "--no-progress"])
    import runlog
    rows = runlog.read_metrics(d)
    assert "grad/all/task" in rows[0] and "grad/bucket_2/entropy" in rows[0] and "time/grad_analysis" in rows[0]
    assert not any(k.startswith("grad/") for k in rows[1])         # every 2nd step only
    assert (d / "plots" / "grad_buckets.png").exists()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import snr_probe
    m = snr_probe.main(["--from-run", str(d), "--step", "1", "--kl-coef", "0.01", "--plot", str(tmp_path / "fig3.png")])
    assert (tmp_path / "fig3.png").exists() and "grad/bucket_1/task" in m
    assert m["grad/all/kl"] > 0     # KL to the initial model (exactly 0 if the reference were the loaded policy)
    assert "| bucket |" in capsys.readouterr().out
