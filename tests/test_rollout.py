"""rollout.py: parsing, penalties, budgets and episode ends with a scripted policy; token-level invariants
(masks decode back to exactly the assistant outputs, X ends with <think>, Z holds no tags, groups share
their first prompt); real envs; the real batched `generate` (stop string, eos, left padding) and a tiny-model
rollout whose sampling log-probs equal the recomputed ones; a slow SmolLM2 rollout."""
import re

import pytest
import torch

import config
import envs
import policy
import sampling
import rollout
from rollout import RolloutConfig


@pytest.fixture(scope="module")
def tiny():
    return policy.load("tiny", seed=0)


class LineEnv:
    """Walk from 0 to `goal` on a line: -0.1 per valid move, +1 more on reaching the goal (done, success)."""
    name = "line"

    def __init__(self, goal=3, max_turns=3, max_actions_per_turn=2, max_actions=4, max_tokens=50):
        self.goal, self.max_turns, self.max_actions_per_turn = goal, max_turns, max_actions_per_turn
        self.max_actions, self.max_tokens = max_actions, max_tokens
        self.instructions = "Walk right to the goal. Actions: Left, Right."

    def reset(self, seed, member=0):
        self.seed, self.pos, self.done, self.success = seed, 0, False, False
        return self.render()

    def render(self):
        return f"seed {self.seed} pos {self.pos} goal {self.goal}"

    def step(self, action):
        a = action.strip().lower()
        if self.done or a not in ("left", "right"):
            return self.render(), 0.0, self.done, {"valid": False, "success": self.success}
        self.pos += 1 if a == "right" else -1
        reward = -0.1
        if self.pos == self.goal:
            reward, self.done, self.success = 0.9, True, True
        return self.render(), reward, self.done, {"valid": True, "success": self.success}


class Scripted:
    """A fake policy: script(seed, turn, row) -> text, returned as its token ids; counts generate calls."""

    def __init__(self, script):
        self.script, self.calls = script, []

    def __call__(self, model, tokenizer, contexts, **kw):
        self.calls.append(len(contexts))
        outs = []
        for row, ctx in enumerate(contexts):
            text = tokenizer.decode(ctx)
            seed = int(re.findall(r"seed (\d+)", text)[0]) if "seed " in text else -1
            turn = len(re.findall(r"Turn \d+:\n", text))
            ids = tokenizer.encode(self.script(seed, turn, row), add_special_tokens=False)
            outs.append((ids, [0.0] * len(ids)))
        return outs


def run(tiny, script, seeds=(7,), G=1, env_kw=None, **cfg_kw):
    model, tok = tiny
    policy_fn = Scripted(script)
    trajs = rollout.rollout(model, tok, RolloutConfig(**cfg_kw), list(seeds), G,
                            env_fn=lambda: LineEnv(**(env_kw or {})), generate_fn=policy_fn)
    for tr in trajs:
        check_invariants(tr, tok, cfg_kw.get("think", True), cfg_kw.get("z_tokens", "sampled"))
    return trajs, policy_fn


def assert_logp_matches_sampling(model, tok, trajs, atol):
    """Log-probs recomputed on the training tensors equal the sampling log-probs (no re-tokenisation drift)."""
    t = rollout.to_tensors(trajs, pad_id=tok.pad_token_id)
    with torch.no_grad():
        logp, _ = policy.token_logprobs(model, t["input_ids"], t["attention_mask"], t["loss_mask"])
    for b, tr in enumerate(trajs):
        sampled = torch.tensor([x for turn in tr.turns for x in turn.gen_logp])
        assert torch.allclose(logp[b][t["loss_mask"][b] == 1], sampled, atol=atol)


def check_invariants(tr, tok, think=True, z_tokens="sampled"):
    """Token-level facts every trajectory must satisfy."""
    dec = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    assert len(tr.input_ids) == len(tr.loss_mask)
    assert sum(tr.loss_mask) == sum(len(t.gen_ids) for t in tr.turns)
    for t in tr.turns:
        start, n = len(t.x_ids), len(t.gen_ids)
        assert tr.input_ids[:start] == t.x_ids  # X = exactly the context the model was given
        assert tr.input_ids[start:start + n] == t.gen_ids and tr.loss_mask[start:start + n] == [1] * n
        assert dec(t.gen_ids) == t.text  # the masked tokens decode to exactly the assistant output
        assert dec(t.x_ids).endswith("<think>" if think else "<answer>")
        z = dec(t.z_ids)
        assert not any(tag in z for tag in ("<think>", "</think>", "<answer>", "</answer>"))
        if think and "</think>" in t.text and z_tokens == "sampled":
            reasoning = t.text[:t.text.find("</think>")]
            if "<" not in reasoning:
                assert reasoning.startswith(z) and len(reasoning) - len(z) <= 3  # at most a straddling " </"
            assert reasoning.startswith(z)
        elif "</think>" not in t.text or not think:
            assert t.z_ids == []
    assert tr.ret == pytest.approx(tr.env_reward + tr.penalty)
    assert tr.env_reward == pytest.approx(sum(t.reward for t in tr.turns))
    assert tr.penalty == pytest.approx(sum(t.penalty for t in tr.turns))
    roles = [m["role"] for m in tr.messages]
    assert roles == ["system"] + ["user", "assistant"] * len(tr.turns)
    # the chat record renders to the token sequence plus only the closing of the last assistant message
    rendered = tok.apply_chat_template(tr.messages, tokenize=False)
    seen = dec(tr.input_ids)
    assert rendered.startswith(seen) and rendered[len(seen):] in ("<|im_end|>\n", "\n")


def test_parse_response():
    p = rollout.parse_response
    assert p(" go </think> <answer>Right || Left</answer>", True, 2) == (True, ["Right", "Left"])
    assert p("x</think>\n\n<answer> Up ||  || Down || Left </answer>", True, 2) == (True, ["Up", "Down"])
    assert p("x</think><answer></answer>", True, 2) == (True, [])  # well-formed, but no action
    assert p("no tags at all", True, 2) == (False, [])
    assert p("unclosed <answer>Up</answer>", True, 2) == (False, [])  # </think> missing
    assert p("x</think> junk <answer>Up</answer>", True, 2) == (False, [])  # text between the blocks
    assert p("x</think><answer>Up<|im_end|></answer>", True, 2) == (True, ["Up"])  # special strings stripped
    assert p("Up || Down</answer>", False, 1) == (True, ["Up"])  # answer-only mode
    assert p("Up || Down", False, 1) == (False, [])


def test_scripted_episode_reaches_goal(tiny):
    script = lambda seed, turn, row: " walk right </think> <answer>Right || Right</answer>"  # noqa: E731
    (tr,), pol = run(tiny, script)
    assert pol.calls == [1, 1]  # two turns, one batched call each
    assert tr.success and tr.end_reason == "done" and not tr.truncated
    assert [t.actions for t in tr.turns] == [["Right", "Right"], ["Right"]]  # 4th action: env already done
    assert [t.parsed for t in tr.turns] == [["Right", "Right"], ["Right", "Right"]]
    assert tr.turns[0].reward == pytest.approx(-0.2) and tr.turns[1].reward == pytest.approx(0.9)
    assert tr.ret == pytest.approx(0.7) and tr.penalty == 0 and tr.num_actions == 3
    # the next user message starts with the previous turn's reward, then the next turn block
    assert tr.messages[3]["content"].startswith("Reward:\n-0.2\nTurn 2:\nState:\nseed 7 pos 2 goal 3\n"
                                                "You have 2 actions left.")
    assert tr.messages[2]["content"] == "<think> walk right </think> <answer>Right || Right</answer>"
    assert tok_text(tiny, tr.turns[0].z_ids) == " walk right"  # the " </" token straddles the tag


def tok_text(tiny, ids):
    return tiny[1].decode(ids)


@pytest.mark.parametrize("rule", ["no_valid", "any_invalid"])
def test_format_penalties(tiny, rule):
    texts = {1: "garbage without tags",  # no parse
             2: " x </think><answer>Jump || Right</answer>",  # one invalid, one valid
             3: " x </think><answer>Jump</answer>"}  # only invalid
    (tr,), _ = run(tiny, lambda s, turn, r: texts[turn], penalty_rule=rule, format_penalty=-0.5)
    assert [t.format_ok for t in tr.turns] == [False, True, True]
    assert [t.valid for t in tr.turns] == [[], [False, True], [False]]
    expected = [-0.5, -0.5 if rule == "any_invalid" else 0.0, -0.5]
    assert [t.penalty for t in tr.turns] == expected
    assert tr.end_reason == "max_turns" and tr.ret == pytest.approx(sum(expected) - 0.1)
    assert tr.num_actions == 1  # invalid actions cost no budget


def test_action_budget_and_max_turns(tiny):
    back = lambda s, turn, r: " back </think><answer>Left || Left || Left</answer>"  # noqa: E731
    (tr,), _ = run(tiny, back, env_kw=dict(max_actions=3, max_turns=5))
    assert tr.end_reason == "budget" and tr.num_actions == 3 and len(tr.turns) == 2
    assert [t.parsed for t in tr.turns] == [["Left", "Left"]] * 2  # capped at max_actions_per_turn
    assert [t.actions for t in tr.turns] == [["Left", "Left"], ["Left"]]  # budget stops the 4th
    assert "You have 1 actions left." in tr.messages[3]["content"]
    (tr,), _ = run(tiny, back, env_kw=dict(max_actions=10, max_turns=5), max_turns=2)  # config override
    assert tr.end_reason == "max_turns" and len(tr.turns) == 2 and not tr.truncated


def test_groups_share_first_prompt_and_batch_only_active_envs(tiny):
    # group 0 (seed 3) finishes in turn 1 for row 0 only; others keep walking left
    def script(seed, turn, row):
        if seed == 3 and turn == 1 and row == 0:
            return " go </think><answer>Right || Right</answer>"
        return " wait </think><answer>Left</answer>"
    trajs, pol = run(tiny, script, seeds=(3, 8), G=3, env_kw=dict(goal=2))
    assert [tr.group for tr in trajs] == [0, 0, 0, 1, 1, 1] and [tr.seed for tr in trajs] == [3, 3, 3, 8, 8, 8]
    assert pol.calls == [6, 5, 5]  # one call per turn with exactly the still-active envs
    assert trajs[0].success and trajs[0].end_reason == "done" and len(trajs[0].turns) == 1
    first = [tr.turns[0].x_ids for tr in trajs]
    assert first[0] == first[1] == first[2] and first[3] == first[4] == first[5] and first[0] != first[3]
    t = rollout.to_tensors(trajs, pad_id=2)
    assert t["group"].tolist() == [0, 0, 0, 1, 1, 1]
    assert t["returns"].tolist() == pytest.approx([tr.ret for tr in trajs])


def test_context_cap_truncates_and_first_prompt_must_fit(tiny):
    script = lambda s, turn, r: " x </think><answer>Left</answer>"  # noqa: E731
    (probe,), _ = run(tiny, script, max_turns=1)
    first = len(probe.turns[0].x_ids)
    (tr,), _ = run(tiny, script, max_new_tokens=20, max_context=first + 40)  # turn 2 cannot fit
    assert tr.end_reason == "context" and tr.truncated and len(tr.turns) == 1
    assert [m["role"] for m in tr.messages] == ["system", "user", "assistant"]
    with pytest.raises(ValueError, match="max_context"):
        run(tiny, script, max_new_tokens=20, max_context=first + 10)


@pytest.mark.parametrize("text", ["", "<|im_end|>", "</think></think><answer>", "<answer>Right</answer>",
                                  "<think><think></think><answer>||||</answer>", "é中文🙂 </think><answer>Right",
                                  " a" * 300, " ok </think>\n<answer> right ||RIGHT|| left </answer><|im_end|>"])
def test_malformed_outputs_never_crash(tiny, text):
    trajs, _ = run(tiny, lambda s, turn, r: text, seeds=(1, 2), G=2)  # invariants checked inside run
    for tr in trajs:
        assert tr.end_reason in ("done", "budget", "max_turns") and len(tr.turns) >= 1
        for t in tr.turns:
            assert t.penalty in (0.0, -0.1) and (t.penalty == -0.1) == (not any(t.valid))


def test_no_think_mode(tiny):
    (tr,), _ = run(tiny, lambda s, turn, r: "Right || Right</answer>", think=False)
    assert tr.success and all(t.z_ids == [] for t in tr.turns)
    assert "<answer> [your answer] </answer>" in tr.messages[1]["content"]
    assert "<think>" not in tr.messages[1]["content"]


def test_retokenized_z(tiny):
    (tr,), _ = run(tiny, lambda s, turn, r: "  plan: go <answer> </think><answer>Right</answer>",
                   z_tokens="retokenize", max_turns=1)
    assert tiny[1].decode(tr.turns[0].z_ids) == "plan: go"  # stripped, special strings removed


def test_to_tensors_padding_and_cap(tiny):
    trajs, _ = run(tiny, lambda s, turn, r: f" t{turn} " * (s % 5 + 1) + "</think><answer>Left</answer>",
                   seeds=(1, 2, 3))
    t = rollout.to_tensors(trajs, pad_id=0)
    lengths = [len(tr.input_ids) for tr in trajs]
    assert t["input_ids"].shape == (3, max(lengths))
    for b, tr in enumerate(trajs):
        n = lengths[b]
        assert t["input_ids"][b, :n].tolist() == tr.input_ids and (t["input_ids"][b, n:] == 0).all()
        assert t["attention_mask"][b].tolist() == [1] * n + [0] * (max(lengths) - n)
        assert t["loss_mask"][b, :n].tolist() == tr.loss_mask and t["loss_mask"][b, n:].sum() == 0
    with pytest.raises(ValueError, match="max_len"):
        rollout.to_tensors(trajs, pad_id=0, max_len=min(lengths) - 1)
    clipped = rollout.to_tensors(trajs, pad_id=0, max_len=min(lengths) - 1, clip=True)
    assert clipped["input_ids"].shape == (3, min(lengths) - 1)
    assert torch.equal(clipped["loss_mask"], t["loss_mask"][:, :min(lengths) - 1])


def test_config_validation():
    for bad in (dict(penalty_rule="paper"), dict(z_tokens="text"), dict(max_context=100, max_new_tokens=100),
                dict(top_p=0.0), dict(temperature=-1.0), dict(max_turns=-1)):
        with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
            RolloutConfig(**bad)


@pytest.mark.parametrize("name,seed", [("frozenlake", 11), ("sokoban", 4), ("countdown", 3)])
def test_real_envs_solved_by_scripted_policy(tiny, name, seed):
    """Feeding each env's known solution through the rollout solves it, with the env's reward rules."""
    made = []

    def env_fn():
        made.append(envs.make_env(name))
        return made[-1]

    def solver(model, tokenizer, contexts, **kw):
        k = len(re.findall(r"Turn \d+:\n", tokenizer.decode(contexts[0])))
        sol, per = made[0].solution, made[0].max_actions_per_turn
        answer = " || ".join(sol[(k - 1) * per:k * per])
        ids = tokenizer.encode(f" solve </think> <answer>{answer}</answer>", add_special_tokens=False)
        return [(ids, [0.0] * len(ids))] * len(contexts)

    model, tok = tiny
    trajs = rollout.rollout(model, tok, RolloutConfig(env=name), [seed], 2, env_fn=env_fn, generate_fn=solver)
    for tr in trajs:
        check_invariants(tr, tok)
        assert tr.success and tr.end_reason == "done" and tr.penalty == 0
        n = len(made[0].solution)
        expected = {"frozenlake": 1.0, "sokoban": 11 - 0.1 * n, "countdown": 1.0}[name]
        assert tr.ret == pytest.approx(expected)
        assert len(tr.turns) == -(-n // made[0].max_actions_per_turn)
        assert "You're a helpful assistant. " + made[0].instructions == tr.messages[0]["content"]


def test_tiny_model_rollout_logprobs_have_no_drift(tiny):
    """A real batched rollout with the tiny model: log-probs recomputed on the training tensors equal the
    sampling log-probs (same ids, same positions), so old_logp == behaviour logp at temperature 1."""
    model, tok = tiny
    calls = []

    def counting_generate(*args, **kw):
        calls.append(len(args[2]))
        return sampling.generate(*args, **kw)

    torch.manual_seed(0)
    cfg = RolloutConfig(env="frozenlake", max_new_tokens=8, max_turns=2, bf16=False)  # exactness: fp32 pinned
    trajs = rollout.rollout(model, tok, cfg, [10, 11], 2, generate_fn=counting_generate)
    assert calls == [4, 4]  # random text never acts validly: everyone plays both turns, one call per turn
    for tr in trajs:
        check_invariants(tr, tok)
        assert [len(t.gen_ids) for t in tr.turns] == [8, 8] and tr.ret == pytest.approx(-0.2)
    assert_logp_matches_sampling(model, tok, trajs, atol=1e-4)
    torch.manual_seed(0)
    again = rollout.rollout(model, tok, cfg, [10, 11], 2)
    assert [tr.input_ids for tr in again] == [tr.input_ids for tr in trajs]  # seeded -> reproducible
    torch.manual_seed(0)  # re-encoding every turn instead of reusing KV states: the same samples
    plain = rollout.rollout(model, tok, RolloutConfig(env="frozenlake", max_new_tokens=8, max_turns=2,
                                                      reuse_kv=False, bf16=False), [10, 11], 2)
    assert [tr.input_ids for tr in plain] == [tr.input_ids for tr in trajs]
    for tr, ref in zip(plain, trajs):
        for t, r in zip(tr.turns, ref.turns):
            assert t.gen_logp == pytest.approx(r.gen_logp, abs=1e-4)


@pytest.mark.slow
def test_smollm2_rollout_two_envs_two_turns():
    model, tok = policy.load("smollm2-135m")
    torch.manual_seed(0)
    cfg = RolloutConfig(env="frozenlake", max_new_tokens=48, max_turns=2, bf16=False)  # fp32: exact recomputation
    trajs = rollout.rollout(model, tok, cfg, [123], 2)
    assert len(trajs) == 2 and trajs[0].turns[0].x_ids == trajs[1].turns[0].x_ids
    for tr in trajs:
        check_invariants(tr, tok)
        assert 1 <= len(tr.turns) <= 2 and all(1 <= len(t.gen_ids) <= 48 for t in tr.turns)
    assert_logp_matches_sampling(model, tok, trajs, atol=1e-3)
    m = rollout.rollout_metrics(trajs)
    assert 0 <= m["format_ok_rate"] <= 1 and m["num_trajectories"] == 2


def test_template_turn_terminator_is_a_stop_token_when_eos_differs():
    """A base checkpoint whose eos (<|endoftext|>) is not the chat template's turn terminator (<|im_end|>): the
    terminator still stops a turn, so no invented next user turn enters the loss or the answer parser."""
    import copy
    import sampling
    model, tok = policy.load("tiny", seed=0)
    base_tok = copy.deepcopy(tok)
    base_tok.eos_token = "<|endoftext|>"
    model.generation_config.eos_token_id = base_tok.eos_token_id
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert base_tok.eos_token_id != im_end
    assert sampling.turn_end_id(base_tok) == im_end
    assert sampling.eos_ids(model, base_tok) == {base_tok.eos_token_id, im_end}


@pytest.mark.parametrize("bf16,atol", [(False, 1e-5), (True, 1e-3)])   # bf16: measured identical (AVX512-BF16)
def test_dropping_finished_rows_changes_no_sample(tiny, bf16, atol):
    """sampling.generate removes rows that have stopped from the running batch every `drop_every` steps (a
    speed-up): for a fixed seed the samples, their log-probs and the KV states kept for the next turn equal those
    of one uninterrupted generate call (drop_every=0), over two turns with ragged contexts; in fp32 and in bf16
    (the bf16 weight copy, bf16 KV states)."""
    model, tok = tiny
    g = torch.Generator().manual_seed(0)
    first = [torch.randint(100, 40000, (n,), generator=g).tolist() for n in (30, 30, 12, 21, 5)]
    first[1] = list(first[0])        # rows 0 and 1 share their first prompt (stored once: sampling.Prompt)
    results = {}
    for drop_every in (0, 1, 3):
        torch.manual_seed(0)
        kv, ctx, outs = sampling.KVStore(), [list(c) for c in first], []
        for turn in range(2):
            # stop string "e": most tokens contain one, so rows stop after different numbers of steps
            out = sampling.generate(model, tok, ctx, max_new_tokens=12, temperature=1.0, stop=("e",), kv=kv,
                                    keys=range(5), drop_every=drop_every, bf16=bf16)
            outs.append(out)
            ctx = [c + ids + [11, 12, 13] for c, (ids, _) in zip(ctx, out)]
        results[drop_every] = (outs, kv)
    ref, ref_kv = results[0]
    assert len({len(ids) for out in ref for ids, _ in out}) >= 3  # the rows did stop at different steps
    for drop_every in (1, 3):
        outs, kv = results[drop_every]
        for out, r in zip(outs, ref):
            assert [ids for ids, _ in out] == [ids for ids, _ in r]
            for (_, lp), (_, lr) in zip(out, r):
                assert lp == pytest.approx(lr, abs=atol)
        assert sorted(kv.entries) == sorted(ref_kv.entries) == list(range(5))
        assert ref_kv.entries[0].prompt is ref_kv.entries[1].prompt is not None     # still stored once
        for key, entry in ref_kv.entries.items():
            assert kv.entries[key].ids == entry.ids
            for (k, v), (k2, v2) in zip(kv.entries[key].full(), entry.full()):
                assert k.dtype == (torch.bfloat16 if bf16 else torch.float32)
                assert not (k.requires_grad or v.requires_grad)      # generate runs without autograd
                assert torch.allclose(k, k2, atol=10 * atol) and torch.allclose(v, v2, atol=10 * atol)
    with pytest.raises(ValueError, match="drop_every"):
        sampling.generate(model, tok, first, max_new_tokens=2, drop_every=-1)


# ------------------------------------------------------------------------------- chat templates (thinking models)
# A Qwen3-style template: earlier assistant turns lose their <think> block (only the text after </think> is kept).
DROPS_THINK = ("{%- for message in messages %}{%- if message['role'] == 'assistant' and not loop.last %}"
               "{{ '<|im_start|>assistant\\n' + message['content'].split('</think>')[-1].lstrip() + '<|im_end|>\\n' }}"
               "{%- else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
               "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")


def test_a_template_that_rewrites_history_is_refused_and_chatml_fixes_it(tiny, tmp_path):
    import copy

    import config
    import train
    model, tok = tiny
    rollout.check_template(tok)                                     # SmolLM2's own template keeps every turn
    bad = copy.deepcopy(tok)
    bad.chat_template = DROPS_THINK
    with pytest.raises(ValueError, match="--chat-template chatml"):
        rollout.check_template(bad)
    # what the check prevents: every multi-turn episode silently ends after its first turn
    cfg = RolloutConfig(env="frozenlake", max_new_tokens=30)
    thinks = Scripted(lambda seed, turn, row: " I bump the wall.</think> <answer>Up</answer><|im_end|>")
    ended = [t.end_reason for t in rollout.rollout(model, bad, cfg, [0, 1], 1, generate_fn=thinks)]
    assert ended == ["template", "template"]
    fixed = policy.set_chat_template(copy.deepcopy(bad), "chatml")
    rollout.check_template(fixed)
    assert all(len(t.turns) > 1 for t in rollout.rollout(model, fixed, cfg, [0, 1], 1, generate_fn=thinks))
    # train.py: refused in one line before anything is written; a single-turn env does not need the check
    path = tmp_path / "drops_think.jinja"
    path.write_text(DROPS_THINK)
    argv = ["--preset", "smoke", "--out-dir", str(tmp_path / "runs"), "--chat-template", str(path), "--no-progress"]
    with pytest.raises(config.UsageError, match="--chat-template.*chatml") as e:
        train.main([*argv, "--env", "frozenlake"])
    assert "\n" not in str(e.value) and not (tmp_path / "runs").exists()
    train.load_policy(config.resolve([*argv, "--env", "bandit"])[0], "cpu")


def test_per_turn_metrics_on_a_worked_batch():
    """Three episodes: success at turn 1; success at turn 3 after a malformed turn 2; failure after 2 turns."""
    def turn(ok, valid):
        return rollout.Turn(x_ids=[], z_ids=[], gen_ids=[1], text="", actions=[], valid=valid, reward=0.0,
                            penalty=0.0, format_ok=ok)
    trajs = [rollout.Trajectory(group=0, seed=0, env_name="w", messages=[], success=True, turns=[turn(True, [True])]),
             rollout.Trajectory(group=0, seed=0, env_name="w", messages=[], success=True,
                                turns=[turn(True, [True]), turn(False, []), turn(True, [False, True])]),
             rollout.Trajectory(group=0, seed=0, env_name="w", messages=[], success=False,
                                turns=[turn(True, [False]), turn(True, [True])])]
    m = rollout.rollout_metrics(trajs)
    assert [m[f"reached_turn{k}"] for k in (1, 2, 3)] == pytest.approx([1, 2 / 3, 1 / 3])
    assert [m[f"success_by_turn{k}"] for k in (1, 2, 3)] == pytest.approx([1 / 3, 1 / 3, 2 / 3])
    assert m["success_by_turn3"] == pytest.approx(m["success"])
    assert [m[f"format_ok_turn{k}"] for k in (1, 2, 3)] == pytest.approx([1, 1 / 2, 1])
    assert [m[f"valid_turn_rate_turn{k}"] for k in (1, 2, 3)] == pytest.approx([2 / 3, 1 / 2, 1])
    assert "turn4" not in " ".join(m) and m["turns"] == pytest.approx(2)
    single = rollout.rollout_metrics(trajs[:1])                      # single-turn batches get no per-turn keys
    assert not any(k[-1].isdigit() for k in single)


def test_the_prompt_states_the_budgets_the_rollout_enforces():
    """--max-turns 3 --max-new-tokens 48 on FrozenLake: the system prompt says 3 turns and the turn block 48 tokens
    (prompt_budgets="rollout", the default); "env" keeps the env's own 5 turns / 120 words (runs made before)."""
    model, tok = policy.load("tiny", seed=0)
    texts = {}
    for budgets in ("rollout", "env"):
        cfg = RolloutConfig(env="frozenlake", max_turns=3, max_new_tokens=8, bf16=False, prompt_budgets=budgets)
        torch.manual_seed(0)
        tr = rollout.rollout(model, tok, cfg, [5], 1)[0]
        texts[budgets] = tr.messages[0]["content"] + tr.messages[1]["content"]
        assert len(tr.turns) <= 3
    assert "at most 3 turns" in texts["rollout"] and "Max response length: 8 words" in texts["rollout"]
    assert "at most 5 turns" in texts["env"] and "Max response length: 120 words" in texts["env"]
    bandit = rollout.stated_env_options(RolloutConfig(env="bandit", max_turns=3, max_new_tokens=48))
    assert bandit == {"max_tokens": 48}                              # single-turn: no max_turns option to set
    keep = rollout.stated_env_options(RolloutConfig(env="frozenlake", env_options={"max_tokens": 99}, max_turns=2))
    assert keep == {"max_tokens": 99, "max_turns": 2}                 # an explicit option wins
    with pytest.raises(ValueError, match="contradicts"):
        rollout.stated_env_options(RolloutConfig(env="frozenlake", env_options={"max_turns": 5}, max_turns=3))
    with pytest.raises(config.UsageError, match="--max-turns: 3 contradicts"):
        config.resolve(["--env", "frozenlake", "--env-options", '{"max_turns": 5}', "--max-turns", "3"])
