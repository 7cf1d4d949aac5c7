"""LoRA through peft (policy.add_lora, train.py --lora-rank): only the adapters train, the KL reference / frozen MI
scorer is the base model with adapters disabled and stays fixed, the update equals full fine-tuning pushed through
the chain rule onto the adapters, checkpoints hold adapters only and resume exactly. Tiny model, CPU, fast.
Run: `.venv/bin/python -m pytest tests/test_lora.py -q`."""
import copy

import pytest
import torch

import config
import filter as rvfilter
import policy
import runlog
import train
import update as upd
from test_train import OneProcess, scripted_batch, seq_logp

GROUPS = [[(" Left", 1.0), (" Right", 0.0), (" Up", 0.5), (" Left please", 1.0)]]


def lora_args(*extra):
    return config.resolve(["--model", "tiny", "--algo", "grpo", "--groups", "1", "--group-size", "4",
                           "--mini-batch", "4", "--micro-batch", "2", "--filter", "none", "--no-bf16",
                           "--lora-rank", "4", "--lora-alpha", "8", *extra])[0]


def one_update(L, tok, args, steps=1):
    trajs, R = scripted_batch(tok, GROUPS)
    dist, owner = train.Dist(OneProcess()), torch.zeros(1, dtype=torch.long)
    for _ in range(steps):
        fres = rvfilter.apply_filter(R, config.filter_config(args))
        batch = upd.prepare_batch(trajs, R, owner, fres, L.model, L.critic, L.frozen if args.kl_coef > 0 else None,
                                  tok, args, dist)
        out = upd.update(L.model, L.critic, L.opt, L.copt, batch, args, dist)
    return trajs, out


def test_only_adapter_gradients_are_nonzero_and_base_weights_stay():
    model, tok = policy.load("tiny", seed=0)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    args = lora_args("--lr", "1e-2")
    L = train.build_learner(model, args)
    assert policy.is_lora(L.model)
    named = dict(L.model.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {id(p) for g in L.opt.param_groups for p in g["params"]} == {id(named[n]) for n in trainable}
    trajs, R = scripted_batch(tok, GROUPS)
    b = __import__("rollout").to_tensors(trajs, tok.pad_token_id)
    lp, _ = policy.token_logprobs(L.model, b["input_ids"], b["attention_mask"], b["loss_mask"])
    (-(lp.sum())).backward()
    for n, p in named.items():
        if n in trainable and "lora_B" in n:          # B starts at 0, so A's first gradient is 0 (chain rule)
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        if n not in trainable:
            assert p.grad is None, n
    L.opt.zero_grad(set_to_none=True)
    one_update(L, tok, args, steps=2)
    after = L.model.get_base_model().state_dict()
    for k, v in base.items():                         # base weights bit-identical after training
        key = k.replace(".weight", ".base_layer.weight") if k.replace(".weight", ".base_layer.weight") in after else k
        assert torch.equal(after[key], v), k
    assert all(not torch.equal(named[n], torch.zeros_like(named[n])) for n in trainable if "lora_B" in n)


def test_reference_is_the_base_model_and_is_unchanged_by_training():
    model, tok = policy.load("tiny", seed=0)
    original = copy.deepcopy(model)
    args = lora_args("--lr", "1e-2", "--kl-coef", "0.05", "--mi-scorer", "both")
    L = train.build_learner(model, args)
    assert isinstance(L.frozen, policy.AdapterOff) and L.frozen.peft is L.model        # no second copy
    trajs, _ = scripted_batch(tok, GROUPS)
    before = seq_logp(original, tok, trajs)
    assert torch.allclose(seq_logp(L.model, tok, trajs), before, atol=1e-6)            # B = 0: starts at the base
    _, out = one_update(L, tok, args, steps=3)
    assert out["train/kl"] > 0
    assert torch.equal(seq_logp(L.frozen, tok, trajs), before)                         # reference unchanged
    assert not torch.allclose(seq_logp(L.model, tok, trajs), before, atol=1e-4)        # the policy moved
    assert all(p.requires_grad for n, p in L.model.named_parameters() if "lora_" in n)  # re-enabled after scoring


def test_critic_has_its_own_adapter_on_the_shared_frozen_base():
    model, tok = policy.load("tiny", seed=0)
    args = lora_args("--algo", "ppo", "--critic-lr", "1e-2", "--lr", "1e-2")
    L = train.build_learner(model, args)
    pol = {p.data_ptr() for p in L.model.parameters() if not p.requires_grad}
    crit_frozen = [p for p in L.critic.parameters() if not p.requires_grad]
    assert crit_frozen and all(p.data_ptr() in pol for p in crit_frozen)              # shared, not copied
    crit_train = {n for n, p in L.critic.named_parameters() if p.requires_grad}
    assert crit_train and all("lora_" in n or n.startswith("v_head") for n in crit_train)
    pol_ptrs = {p.data_ptr() for p in L.model.parameters() if p.requires_grad}
    assert not pol_ptrs & {p.data_ptr() for p in L.critic.parameters() if p.requires_grad}  # own adapter
    v0 = {n: p.clone() for n, p in L.critic.named_parameters() if p.requires_grad}
    one_update(L, tok, args, steps=2)
    assert not torch.equal(v0["v_head.weight"], L.critic.v_head.weight)


def test_lora_update_equals_full_finetuning_restricted_to_the_adapters():
    """Hand-built case: the LoRA weight is W' = W + s B A (s = alpha/r). With plain SGD (lr 1, no clipping), the
    adapters' step is the chain rule applied to the full fine-tuning gradient G = dL/dW' of the merged model:
    dB = -s G A^T, dA = -s B^T G."""
    model, tok = policy.load("tiny", seed=0)
    args = lora_args("--lora-targets", "q_proj,v_proj", "--grad-clip", "1e9", "--entropy-coef", "0.01")
    peft_model = policy.add_lora(model, 4, 8.0, "q_proj,v_proj")
    torch.manual_seed(1)
    with torch.no_grad():                              # B != 0, so both A and B get a gradient
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    merged = copy.deepcopy(peft_model).merge_and_unload().requires_grad_(True)    # plain model, W' = W + s B A
    lr, s = 1.0, 8.0 / 4
    trajs, R = scripted_batch(tok, GROUPS)
    dist, owner = train.Dist(OneProcess()), torch.zeros(1, dtype=torch.long)
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" in n}
    wbefore = {n: p.detach().clone() for n, p in merged.named_parameters()}
    for m in (peft_model, merged):
        fres = rvfilter.apply_filter(R, config.filter_config(args))
        batch = upd.prepare_batch(trajs, R, owner, fres, m, None, None, tok, args, dist)
        upd.update(m, None, torch.optim.SGD(policy.trainable_parameters(m), lr=lr), None, batch, args, dist)
    checked = 0
    for n, p in merged.named_parameters():
        if not n.endswith(("q_proj.weight", "v_proj.weight")):
            continue
        G = -(p.detach() - wbefore[n]) / lr                                     # full fine-tuning gradient (out, in)
        stem = "base_model.model." + n[:-len(".weight")]
        A, B = before[stem + ".lora_A.default.weight"], before[stem + ".lora_B.default.weight"]   # (r, in), (out, r)
        dA = dict(peft_model.named_parameters())[stem + ".lora_A.default.weight"].detach() - A
        dB = dict(peft_model.named_parameters())[stem + ".lora_B.default.weight"].detach() - B
        assert G.abs().max() > 1e-6
        torch.testing.assert_close(dB, -lr * s * G @ A.T, rtol=1e-3, atol=1e-7)
        torch.testing.assert_close(dA, -lr * s * B.T @ G, rtol=1e-3, atol=1e-7)
        checked += 1
    assert checked == 4                                # 2 layers x (q, v)


def run(tmp_path, name, *extra):
    return train.main(["--preset", "smoke", "--out-dir", str(tmp_path), "--name", name, "--no-progress",
                       "--env", "bandit", "--algo", "ppo", "--filter", "none", "--eval-every", "0", "--save-every", "1",
                       "--lora-rank", "4", "--lr", "1e-3", "--critic-lr", "1e-3", "--kl-coef", "0.01", *extra])


def test_lora_checkpoint_holds_adapters_and_resume_is_exact(tmp_path):
    mi = ["--mi-every", "100", "--mi-scorer", "both", "--mi-null", "0"]      # MI on step 0: the frozen scorer runs
    full = run(tmp_path, "full", "--steps", "2", *mi)
    half = run(tmp_path, "half", "--steps", "1", *mi)
    resumed = train.main(["--resume", str(half), "--steps", "2", "--no-progress"])
    a, b = runlog.load_checkpoint(full), runlog.load_checkpoint(resumed)
    assert a["lora"] and a["step"] == b["step"] == 2
    assert a["model"] and all("lora_" in k for k in a["model"])                        # adapters only
    assert all("lora_" in k or k.startswith("v_head") for k in a["critic"])
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["critic"][k], b["critic"][k]) for k in a["critic"])
    assert any(k.endswith("lora_B.weight") and a["model"][k].abs().sum() > 0 for k in a["model"])   # it trained
    rows = runlog.read_metrics(full)
    assert any(k.startswith("mi_") and "_frozen/" in k for k in rows[0])              # frozen MI scorer logged


@pytest.mark.parametrize("argv, flag", [
    (["--lora-rank", "-2"], "--lora-rank"),
    (["--lora-rank", "4", "--lora-alpha", "-1"], "--lora-alpha"),
    (["--lora-rank", "4", "--lora-targets", ","], "--lora-targets"),
])
def test_bad_lora_flags_are_refused(argv, flag):
    with pytest.raises(config.UsageError, match=flag):
        config.resolve(argv)


def test_unknown_target_module_names_the_flag():
    model, _ = policy.load("tiny", seed=0)
    with pytest.raises(ValueError, match="--lora-targets"):
        policy.add_lora(model, 4, 8.0, "no_such_proj")
