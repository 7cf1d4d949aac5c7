"""Multi-turn agent rollouts over P x G environments with batched HF `generate`; Trajectory records; tensors.

What it implements (paper Sec. 4 / App. B, and the official code, mll-lab-nu/RAGEN):
- P groups x G members, group-contiguous (trajectory i is in group i // G); every member of group i resets
  with seeds[i], so a group shares its first prompt (the precondition of reward variance, RV, and of the MI
  proxy's first-turn family).
- Each turn, all still-active envs generate together in ONE batched call (`sampling.generate`: HF `generate`,
  rows that stopped leave the batch every 16 steps, left padding, KV cache, sampling at `temperature` /
  `top_p`, top-k off, at most `max_new_tokens`), stopping at `</answer>` or at the model's end-of-turn token.
  The prompt ends with the forced `<think>` (or `<answer>` with think=False). With reuse_kv (default) each
  env's KV states carry over to its next turn, so only the new tokens of a turn are encoded (the samples are
  the same as re-encoding: tested).
- Parsing, as the reference: regex `<think>(.*?)</think>\\s*<answer>(.*?)</answer>` (DOTALL) on "<think>" +
  the generated text; the answer is split on "||", stripped, empties dropped, at most `max_actions_per_turn`
  kept. Actions go to `env.step` in order while the env is not done and the episode budget lasts (valid
  executed actions < env.max_actions; an invalid action changes nothing and costs nothing, envs.py rule).
- Format penalty (default -0.1) once per turn. penalty_rule="no_valid" (default, the paper's reading: "a
  turn without a valid action"): penalise a turn in which no action was valid (no parse, empty answer, or
  only invalid actions). penalty_rule="any_invalid" (official code): also penalise a turn in which ANY parsed
  action was invalid, even if another one was valid.
- Turn reward = sum of the env rewards of the executed actions; the next user message starts with
  "Reward:\\n<turn reward>\\n" and then the next "Turn k:" block. Episode return ret = env rewards + penalties.
- The episode ends on env done ("done"), action budget used up ("budget"), `max_turns` LLM turns
  ("max_turns"), or the context cap ("context"): if the NEXT turn's context + max_new_tokens would exceed
  `max_context` tokens, the episode ends after the current turn and is marked `truncated` (the reference
  instead drops the oldest turns from the prompt; we never edit what the model has seen). A chat template
  that re-renders earlier turns differently (see below) also ends the episode, truncated ("template").

Token-level conversations (no re-tokenisation drift). The training sequence of a trajectory is built from
the very ids the model was conditioned on and sampled: turn t's context = all previous ids + the tokens of
the NEW text the chat template adds (turn 1: system + user + assistant header; later: the closing of the
previous assistant message, the next user message and the assistant header) + the forced tag. We render the
whole message list with `tokenizer.apply_chat_template`, check that the previous rendering (incl. the decoded
sampled text) is a prefix of it, and tokenise only the suffix. So old log-probs recomputed on `to_tensors`
output equal the sampling log-probs at temperature 1 (tested, via `Turn.gen_logp`).
- loss_mask = 1 exactly on sampled tokens (the model's `<|im_end|>` included when it emitted one); the forced
  `<think>` and everything we append are 0. (Reference: whole assistant turns incl. the forced `<think>`,
  shifted by one token, Sec. 6.3; we deliberately mask exactly the generated tokens.)
- The sequence ends with the last sampled token: the final closing `<|im_end|>\\n` is not appended (it would
  be masked out anyway and cannot change any earlier log-prob).
- Turn.x_ids = that turn's full context ids (ends with the ids of `<think>`). Turn.z_ids = the reasoning:
  z_tokens="sampled" (default) slices the sampled ids before `</think>`: the longest prefix of the generated
  tokens whose text lies entirely before the tag (a token straddling the tag, e.g. " </", is left out; if
  the reasoning itself contains a tag-like string such as a second `<think>`, Z stops there), so
  log p(z | x) scores exactly what was sampled. z_tokens="retokenize" (reference Sec. 2.2): the text between
  the tags with special strings removed, whitespace-stripped and re-tokenised. Z is empty when `</think>` was
  never generated (or think=False); the MI proxy skips empty Z.

Left out: the reference's "previous turn was invalid" warning line, turn-level rewards (use_turn_scores),
context windows other than the full conversation, dropping old turns to fit `max_context`, vLLM.

Run: `python rollout.py --env frozenlake --groups 2 --group-size 2 --model tiny` prints one trajectory.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from dataclasses import dataclass, field

import torch
import policy
import sampling

PENALTY_RULES = ("no_valid", "any_invalid")  # paper reading (default) | official code
Z_TOKENS = ("sampled", "retokenize")  # slice sampled ids (default) | re-tokenise the text like the reference
PROMPT_BUDGETS = ("rollout", "env")  # the prompt states the rollout's turns / token cap (default) | the env's own
SPECIAL_STRINGS = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")
THINK_RE = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass
class RolloutConfig:
    """Rollout settings (train.py maps its flags onto these)."""
    env: str = "frozenlake"  # envs.ENV_NAMES
    env_options: dict = field(default_factory=dict)  # passed to envs.make_env
    max_turns: int | None = None  # LLM turns per episode; None or 0 = the env's max_turns
    max_new_tokens: int = 120  # per-turn token cap (paper/reference: 400; 120 keeps CPU rollouts short)
    temperature: float = 1.0  # training rollouts (reference: 1.0)
    top_p: float = 1.0  # nucleus sampling (1.0 = off, as the paper)
    think: bool = True  # False: answer-only mode (forced "<answer>", no Z)
    format_penalty: float = -0.1  # added once per penalised turn
    penalty_rule: str = "no_valid"  # PENALTY_RULES
    z_tokens: str = "sampled"  # Z_TOKENS
    max_context: int = 3600  # tokens (reference max_model_len 3600)
    bf16: bool | None = None  # sample in bf16 (a bf16 weight copy, sampling.sampling_model); None = where native
    reuse_kv: bool = True  # keep each row's KV states between turns (False: re-encode the conversation)
    val_temperature: float = 0.5  # validation rollouts (reference: 0.5, sampling)
    val_top_p: float = 1.0
    prompt_budgets: str = "rollout"  # PROMPT_BUDGETS: what the prompt states (see stated_env_options)

    def __post_init__(self):
        if self.prompt_budgets not in PROMPT_BUDGETS:
            raise ValueError(f"prompt_budgets must be one of {PROMPT_BUDGETS}, got {self.prompt_budgets!r}")
        if self.penalty_rule not in PENALTY_RULES:
            raise ValueError(f"penalty_rule must be one of {PENALTY_RULES}, got {self.penalty_rule!r}")
        if self.z_tokens not in Z_TOKENS:
            raise ValueError(f"z_tokens must be one of {Z_TOKENS}, got {self.z_tokens!r}")
        if self.max_new_tokens < 1 or self.max_context <= self.max_new_tokens:
            raise ValueError(f"need max_context > max_new_tokens >= 1, got max_context={self.max_context}, "
                             f"max_new_tokens={self.max_new_tokens}")
        for name in ("temperature", "val_temperature"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 (0 = greedy), got {getattr(self, name)}")
        for name in ("top_p", "val_top_p"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.max_turns is not None and self.max_turns < 0:
            raise ValueError(f"max_turns must be >= 0 (0/None = env default), got {self.max_turns}")


def stated_env_options(cfg: RolloutConfig, env_cls=None) -> dict:
    """The options the env is built with. prompt_budgets="rollout": the budgets the prompt states are the ones the
    rollout enforces, i.e. max_turns = cfg.max_turns (when set) and the length hint max_tokens = cfg.max_new_tokens,
    wherever the env class takes them and the options do not set them already (a --max-turns that contradicts an
    explicit max_turns option is a ValueError). "env": the options as given, so the prompt states the env's own
    defaults (5 turns, 120 words on FrozenLake) even when the rollout allows fewer; every run before this option
    existed did that (config.LEGACY)."""
    opts = dict(cfg.env_options)
    if cfg.max_turns and "max_turns" in opts and opts["max_turns"] != cfg.max_turns:
        raise ValueError(f"{cfg.max_turns} contradicts the env option max_turns={opts['max_turns']}")
    if cfg.prompt_budgets == "env":
        return opts
    if env_cls is None:
        import envs  # deferred so tests with a fake env need no env module
        env_cls = envs.env_class(cfg.env)
    params = inspect.signature(env_cls.__init__).parameters
    if cfg.max_turns and "max_turns" in params:
        opts.setdefault("max_turns", cfg.max_turns)
    if "max_tokens" in params:
        opts.setdefault("max_tokens", cfg.max_new_tokens)
    return opts


@dataclass
class Turn:
    """One LLM call of one trajectory."""
    x_ids: list  # context ids up to and including the forced <think> (or <answer>)
    z_ids: list  # reasoning ids between the tags, tags excluded (may be empty)
    gen_ids: list  # sampled ids
    text: str  # decoded sampled ids, special tokens kept (so decode(gen_ids) == text)
    actions: list  # actions sent to env.step, in order
    valid: list  # info["valid"] of each executed action (aligned with actions)
    reward: float  # sum of env rewards this turn
    penalty: float  # format penalty this turn (0 or cfg.format_penalty)
    format_ok: bool  # the <think>..</think><answer>..</answer> regex matched
    parsed: list = field(default_factory=list)  # actions parsed from the answer (before budget / done)
    gen_logp: list = field(default_factory=list)  # log pi(token) at T=1 during sampling, per gen_id


@dataclass
class Trajectory:
    """One episode: chat record, turns, returns, and the token sequence the model saw."""
    group: int
    seed: int
    env_name: str
    messages: list  # [system, user, assistant, user("Reward:..."), assistant, ...]; ends with assistant
    turns: list = field(default_factory=list)
    env_reward: float = 0.0
    penalty: float = 0.0
    ret: float = 0.0  # env_reward + penalty: the episode return used for RV and advantages
    success: bool = False
    truncated: bool = False  # ended by the context cap (or a non prefix-stable template), not by the env
    end_reason: str = ""  # done | budget | max_turns | context | template
    num_actions: int = 0  # valid executed actions
    input_ids: list = field(default_factory=list)  # whole conversation as the model saw it
    loss_mask: list = field(default_factory=list)  # 1 exactly on sampled tokens


# ----------------------------------------------------------------------------------------------------------
# Prompt text and parsing
# ----------------------------------------------------------------------------------------------------------
def turn_block(k: int, obs: str, actions_left: int, max_tokens: int, think: bool) -> str:
    """The per-turn user text (reference Sec. 5.1)."""
    fmt = "<think> [Your thoughts] </think> <answer> [your answer] </answer>" if think else \
        "<answer> [your answer] </answer>"
    return (f"Turn {k}:\nState:\n{obs}\nYou have {actions_left} actions left. Always output: {fmt} "
            f"with no extra text. Strictly follow this format. Max response length: {max_tokens} words (tokens).")


def format_reward(r: float) -> str:
    """Turn reward as shown to the model: rounded to 4 decimals so 0.1 + 0.2 prints as 0.3."""
    return repr(round(float(r), 4))


def parse_response(text: str, think: bool, max_actions: int):
    """(format_ok, actions) for a generated text (without the forced tag, which is prepended here)."""
    m = THINK_RE.search("<think>" + text) if think else ANSWER_RE.search("<answer>" + text)
    if m is None:
        return False, []
    answer = m.group(m.lastindex)
    for s in SPECIAL_STRINGS:
        answer = answer.replace(s, "")
    actions = [a.strip() for a in answer.split("||") if a.strip()]
    return True, actions[:max_actions]


def reasoning_ids(tokenizer, gen_ids: list, text: str, mode: str) -> list:
    """Z of one turn: ids between the forced <think> and the first generated </think> (empty if none)."""
    end = text.find("</think>")
    if end < 0:
        return []
    if mode == "retokenize":  # reference: strip special strings and whitespace, tokenise the text again
        z = text[:end]
        for s in SPECIAL_STRINGS:
            z = z.replace(s, "")
        return tokenizer.encode(z.strip(), add_special_tokens=False)
    # "sampled": Z stops at the first tag-like string (normally the closing </think>; earlier if the model
    # wrote e.g. a second <think> inside its reasoning), so no tag text is ever part of Z
    head = text[:end + len("</think>")]
    cut = min(i for i in (head.find(s) for s in SPECIAL_STRINGS) if i >= 0)  # <= end
    # longest j with decode(gen_ids[:j]) a prefix of text[:cut]; binary search on the decoded length
    dec = lambda j: tokenizer.decode(gen_ids[:j], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    lo, hi = 0, len(gen_ids)
    while lo < hi:  # largest j with len(dec(j)) <= cut
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(dec(mid)) <= cut else (lo, mid - 1)
    j = lo
    while j > 0 and not text[:cut].startswith(dec(j)):  # guard against non-monotone partial-UTF-8 decodes
        j -= 1
    return list(gen_ids[:j])


# ----------------------------------------------------------------------------------------------------------
# The multi-turn loop
# ----------------------------------------------------------------------------------------------------------
def _render(tokenizer, messages, tag):
    """The text the model is conditioned on: chat template + assistant header + the forced tag."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + tag


TEMPLATE_FIX = ("--chat-template chatml (a ChatML template that renders every turn verbatim) or a Jinja file of your "
                "own, or a single-turn env")


def check_template(tokenizer, think: bool = True) -> None:
    """Refuse (ValueError, one line) a chat template that rewrites earlier turns. A multi-turn episode appends only
    what the template adds after the text the model has already seen; that needs the rendering of turn 1 (prompt +
    generated text) to be a prefix of the rendering of turn 2. Thinking-model templates (Qwen3: earlier <think>
    blocks are dropped) break it, and every episode would end as `template` after its first turn."""
    tag = "<think>" if think else "<answer>"
    reply = ("I should move left.</think> <answer>Left</answer>" if think else "Left</answer>")
    msgs = [{"role": "system", "content": "You're a helpful assistant. Rules."},
            {"role": "user", "content": "Turn 1:\nState:\nP_G"}]
    seen = _render(tokenizer, msgs, tag) + reply
    nxt = _render(tokenizer, msgs + [{"role": "assistant", "content": tag + reply},
                                     {"role": "user", "content": "Reward:\n0.0\nTurn 2:\nState:\nPG"}], tag)
    if not nxt.startswith(seen):
        at = next((i for i, (a, b) in enumerate(zip(seen, nxt)) if a != b), min(len(seen), len(nxt)))
        raise ValueError(f"the chat template does not keep earlier turns verbatim (turn 1 as the model saw it is not "
                         f"a prefix of turn 2's prompt; they differ at {seen[at:at + 24]!r} vs {nxt[at:at + 24]!r}, "
                         f"e.g. a thinking-model template dropping earlier <think> blocks), so every multi-turn "
                         f"episode would end after turn 1; use {TEMPLATE_FIX}")


def _forget(kv, i):
    """A finished episode's KV states are no longer needed."""
    if kv is not None:
        kv.drop(i)


def rollout(model, tokenizer, cfg: RolloutConfig, seeds, group_size: int, *, env_fn=None,
            generate_fn=sampling.generate) -> list:
    """P = len(seeds) groups x group_size envs -> list of Trajectory (group-contiguous).

    env_fn() -> a fresh Env (default: envs.make_env(cfg.env, **stated_env_options(cfg))); generate_fn has the
    signature of `generate` (tests pass a scripted policy).
    """
    if group_size < 1 or len(seeds) < 1:
        raise ValueError(f"need group_size >= 1 and at least one seed, got {group_size}, {list(seeds)}")
    if env_fn is None:
        import envs  # deferred so tests with a fake env need no env module

        options = stated_env_options(cfg)
        env_fn = lambda: envs.make_env(cfg.env, **options)  # noqa: E731
    tag = "<think>" if cfg.think else "<answer>"
    eos = sampling.eos_ids(model, tokenizer)
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    dec = lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)  # noqa

    B = len(seeds) * group_size
    envs_, trajs, text = [], [], []  # per trajectory: env, record, text the model has seen so far
    for i in range(B):
        env = env_fn()
        seed = int(seeds[i // group_size])
        obs = env.reset(seed, member=i % group_size)      # same instance per group; see envs.Env.reset
        system = "You're a helpful assistant. " + env.instructions
        user = turn_block(1, obs, env.max_actions, env.max_tokens, cfg.think)
        tr = Trajectory(group=i // group_size, seed=seed, env_name=getattr(env, "name", cfg.env),
                        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
        text.append(_render(tokenizer, tr.messages, tag))
        tr.input_ids = enc(text[-1])
        tr.loss_mask = [0] * len(tr.input_ids)
        if len(tr.input_ids) + cfg.max_new_tokens > cfg.max_context:  # before any generation
            raise ValueError(f"max_context={cfg.max_context} is too small: the first prompt has "
                             f"{len(tr.input_ids)} tokens + max_new_tokens={cfg.max_new_tokens}")
        envs_.append(env)
        trajs.append(tr)
    max_turns = cfg.max_turns or envs_[0].max_turns
    active = list(range(B))
    kv = sampling.KVStore() if cfg.reuse_kv else None  # per-row KV states carried from turn to turn

    for k in range(1, max_turns + 1):
        if not active:
            break
        outs = generate_fn(model, tokenizer, [trajs[i].input_ids for i in active],
                           max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                           bf16=cfg.bf16, kv=kv, keys=active)
        still = []
        for i, (gen_ids, gen_logp) in zip(active, outs):
            tr, env = trajs[i], envs_[i]
            gen_ids = list(gen_ids)
            gen_text = dec(gen_ids)
            format_ok, parsed = parse_response(gen_text, cfg.think, env.max_actions_per_turn)
            turn = Turn(x_ids=list(tr.input_ids), gen_ids=gen_ids, text=gen_text, gen_logp=list(gen_logp),
                        z_ids=reasoning_ids(tokenizer, gen_ids, gen_text, cfg.z_tokens) if cfg.think else [],
                        actions=[], valid=[], reward=0.0, penalty=0.0, format_ok=format_ok, parsed=parsed)
            done = False
            for a in parsed:  # execute in order while the env runs and the budget lasts
                if done or tr.num_actions >= env.max_actions:
                    break
                obs, r, done, info = env.step(a)
                ok = bool(info.get("valid", True))
                turn.actions.append(a)
                turn.valid.append(ok)
                turn.reward += float(r)
                tr.num_actions += ok
                tr.success = bool(info.get("success", tr.success))
            penalised = not any(turn.valid) or (cfg.penalty_rule == "any_invalid" and not all(turn.valid))
            turn.penalty = cfg.format_penalty if penalised else 0.0
            tr.turns.append(turn)
            tr.env_reward += turn.reward
            tr.penalty += turn.penalty
            tr.ret = tr.env_reward + tr.penalty
            # the sequence grows by exactly the sampled ids; the message keeps the text minus the emitted eos
            tr.input_ids += gen_ids
            tr.loss_mask += [1] * len(gen_ids)
            text[i] += gen_text
            content = gen_text[:-len(dec(gen_ids[-1:]))] if gen_ids and gen_ids[-1] in eos else gen_text
            tr.messages.append({"role": "assistant", "content": tag + content})
            # episode ends?
            if done:
                tr.end_reason = "done"
            elif tr.num_actions >= env.max_actions:
                tr.end_reason = "budget"
            elif k == max_turns:
                tr.end_reason = "max_turns"
            if tr.end_reason:
                _forget(kv, i)
                continue
            # next turn's context: tokenise only what the template adds after what the model has seen
            user = "Reward:\n" + format_reward(turn.reward) + "\n" + turn_block(
                k + 1, env.render(), env.max_actions - tr.num_actions, env.max_tokens, cfg.think)
            rendered = _render(tokenizer, tr.messages + [{"role": "user", "content": user}], tag)
            if not rendered.startswith(text[i]):
                tr.end_reason, tr.truncated = "template", True
            suffix = enc(rendered[len(text[i]):]) if not tr.end_reason else []
            if not tr.end_reason and len(tr.input_ids) + len(suffix) + cfg.max_new_tokens > cfg.max_context:
                tr.end_reason, tr.truncated = "context", True
            if tr.end_reason:
                _forget(kv, i)
                continue
            tr.messages.append({"role": "user", "content": user})
            text[i] = rendered
            tr.input_ids += suffix
            tr.loss_mask += [0] * len(suffix)
            still.append(i)
        active = still
    return trajs


# ----------------------------------------------------------------------------------------------------------
# Training tensors, metrics, validation
# ----------------------------------------------------------------------------------------------------------
def to_tensors(trajs, pad_id: int, max_len: int | None = None, *, clip: bool = False) -> dict:
    """Right-padded batch: input_ids, attention_mask, loss_mask (B, T) long; returns (B,) fp32; group (B,).

    max_len caps T. A longer trajectory raises ValueError, or with clip=True keeps its FIRST max_len tokens
    (a causal prefix, so the kept log-probs are unchanged; the cut tokens simply go untrained). The rollout's
    max_context cap makes this rare: set max_len >= cfg.max_context and it never happens.
    """
    if not trajs:
        raise ValueError("trajs must be a non-empty list of Trajectory")
    if max_len is not None and max_len < 1:
        raise ValueError(f"max_len must be >= 1 or None, got {max_len}")
    longest = max(len(tr.input_ids) for tr in trajs)
    if max_len is not None and longest > max_len and not clip:
        raise ValueError(f"a trajectory has {longest} tokens > max_len={max_len}; raise max_len or pass clip=True")
    T = min(longest, max_len) if max_len is not None else longest
    B = len(trajs)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T), dtype=torch.long)
    for b, tr in enumerate(trajs):
        n = min(len(tr.input_ids), T)
        input_ids[b, :n] = torch.tensor(tr.input_ids[:n], dtype=torch.long)
        attention_mask[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(tr.loss_mask[:n], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask,
            "returns": torch.tensor([tr.ret for tr in trajs], dtype=torch.float32),
            "group": torch.tensor([tr.group for tr in trajs], dtype=torch.long)}


def rollout_metrics(trajs) -> dict:
    """Batch means: success, return, env reward, penalty; per-turn format / valid-action rates; lengths; and for
    multi-turn batches the same by turn index (per_turn_metrics)."""
    turns = [t for tr in trajs for t in tr.turns]
    executed = [v for t in turns for v in t.valid]
    n, nt = max(len(trajs), 1), max(len(turns), 1)
    return {
        "success": sum(tr.success for tr in trajs) / n,
        "return": sum(tr.ret for tr in trajs) / n,
        "env_reward": sum(tr.env_reward for tr in trajs) / n,
        "penalty": sum(tr.penalty for tr in trajs) / n,
        "turns": len(turns) / n,
        "format_ok_rate": sum(t.format_ok for t in turns) / nt,  # turns whose tags parsed
        "valid_turn_rate": sum(any(t.valid) for t in turns) / nt,  # turns with >= 1 valid action
        "valid_action_rate": sum(executed) / max(len(executed), 1),  # executed actions that were valid
        "response_tokens": sum(len(t.gen_ids) for t in turns) / nt,  # sampled tokens per turn
        "truncated": sum(tr.truncated for tr in trajs) / n,
        "num_trajectories": float(len(trajs)),
        **per_turn_metrics(trajs),
    }


def per_turn_metrics(trajs) -> dict:
    """Multi-turn batches only (some episode has > 1 turn), for k = 1..longest episode: reached_turn{k} (episodes
    with >= k turns), success_by_turn{k} (episodes that succeeded within their first k turns: success ends the
    episode, so at its last turn), and over the k-th turns of the episodes that reached it format_ok_turn{k} and
    valid_turn_rate_turn{k}."""
    longest, n = max((len(tr.turns) for tr in trajs), default=0), max(len(trajs), 1)
    if longest <= 1:
        return {}
    out = {}
    for k in range(1, longest + 1):
        kth = [tr.turns[k - 1] for tr in trajs if len(tr.turns) >= k]
        out[f"reached_turn{k}"] = len(kth) / n
        out[f"success_by_turn{k}"] = sum(tr.success and len(tr.turns) <= k for tr in trajs) / n
        out[f"format_ok_turn{k}"] = sum(t.format_ok for t in kth) / max(len(kth), 1)
        out[f"valid_turn_rate_turn{k}"] = sum(any(t.valid) for t in kth) / max(len(kth), 1)
    return out


def evaluate(model, tokenizer, cfg: RolloutConfig, seeds, **kwargs) -> dict:
    """Validation: one env per seed (group size 1), sampled at cfg.val_temperature / cfg.val_top_p."""
    val_cfg = dataclasses.replace(cfg, temperature=cfg.val_temperature, top_p=cfg.val_top_p)
    return rollout_metrics(rollout(model, tokenizer, val_cfg, list(seeds), 1, **kwargs))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Run one batched rollout and print the first trajectory.")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--env", default="frozenlake")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-think", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    m, tok = policy.load(a.model)
    c = RolloutConfig(env=a.env, max_new_tokens=a.max_new_tokens, think=not a.no_think)
    trs = rollout(m, tok, c, [10000 + g for g in range(a.groups)], a.group_size)
    print(tok.decode(trs[0].input_ids))
    print({k: round(v, 3) for k, v in rollout_metrics(trs).items()})
