"""rollout_vllm.py: refused cleanly without vllm / a GPU; the LoRA weight merge it sends to the engine; on a CUDA
machine with vllm (skipped elsewhere), its records against HF generate's and against teacher-forced log-probs.
Run: `.venv/bin/python -m pytest tests/test_rollout_vllm.py -q`."""
import copy
import importlib.util

import pytest
import torch

import config
import policy
import rollout_vllm
import sampling

HAVE_VLLM_GPU = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


@pytest.mark.skipif(HAVE_VLLM_GPU, reason="vllm and a GPU are present: nothing to refuse")
def test_vllm_backend_is_refused_without_vllm_or_a_gpu():
    with pytest.raises(config.UsageError, match="--rollout-backend"):
        config.resolve(["--rollout-backend", "vllm"])
    with pytest.raises(ValueError, match="--rollout-backend vllm"):
        rollout_vllm.check_available()
    assert config.resolve([])[0].rollout_backend == "hf"          # the default needs neither


def test_vllm_backend_is_refused_with_cpu_flag():
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


@pytest.mark.skipif(not HAVE_VLLM_GPU, reason="needs vllm and a CUDA GPU")
def test_vllm_records_match_hf_generate_records():
    """Same record format as sampling.generate; the recorded log-probs are the policy's temperature-1 log-probs
    (teacher-forced recomputation, up to bf16 rounding); greedy continuations agree with HF greedy."""
    model, tok = policy.load("smollm2-135m", device="cuda")
    gen = rollout_vllm.VLLMGenerator(model, tok, "smollm2-135m", gpu_memory_utilization=0.2)
    gen.sync(model)
    ctx = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) + tok.encode("<answer>", add_special_tokens=False)
           for q in ("What is 2 + 3?", "Name a colour.", "Say hi.")]
    torch.manual_seed(0)
    out = gen(model, tok, ctx, max_new_tokens=24, temperature=1.0)
    eos = sampling.eos_ids(model, tok)
    for c, (ids, lp) in zip(ctx, out):
        assert 0 < len(ids) == len(lp) <= 24
        text = tok.decode(ids)
        assert ids[-1] in eos or "</answer>" in text or len(ids) == 24                 # one of the stop reasons
        full = torch.tensor([c + ids], device="cuda")
        mask = torch.zeros_like(full)
        mask[0, len(c):] = 1
        ref, _ = policy.token_logprobs(model, full, torch.ones_like(full), mask)
        assert torch.allclose(ref[0, len(c):].cpu(), torch.tensor(lp), atol=0.1)        # bf16 engine vs fp32
    greedy_v = gen(model, tok, ctx, max_new_tokens=12, temperature=0.0)
    greedy_h = sampling.generate(model, tok, ctx, max_new_tokens=12, temperature=0.0, bf16=False)
    agree = sum(a[0][:4] == b[0][:4] for a, b in zip(greedy_v, greedy_h))
    assert agree >= 2                                       # bf16 vs fp32 may flip a near-tie, rarely two
