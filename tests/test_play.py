"""Watching an agent play (`python envs.py ENV --play --agent SOURCE`) and reading a run's logged trajectories
(`python runlog.py RUN --samples [--step K] [--n N]`): the turn-by-turn structure of what they print, the agent's
answers / actions / rewards as the rollout executed them, and the one-line refusals (issue 25).
Run: .venv/bin/python -m pytest tests/test_play.py -q   (tiny model, ~1.5 min)
"""
import re

import pytest

import envs
import runlog
import train

FIELDS = ("observation:", "reasoning:", "answer:", "actions:", "reward:")


def turn_blocks(text: str) -> list[str]:
    """The '--- turn k ---' blocks of a printed episode (the last one stops at the 'episode:' line)."""
    body = text.split("\nepisode:", 1)[0]
    parts = re.split(r"^--- turn (\d+) ---$", body, flags=re.M)
    assert [int(k) for k in parts[1::2]] == list(range(1, len(parts) // 2 + 1))      # numbered 1, 2, ...
    return parts[2::2]


def check_block(block: str) -> None:
    """Each turn shows its fields in order, the reasoning as a marked block, and a reward + done line."""
    lines = block.strip("\n").splitlines()
    starts = [next(i for i, ln in enumerate(lines) if ln.startswith(f)) for f in FIELDS]
    assert starts == sorted(starts), block
    reasoning = lines[starts[1] + 1:starts[2]]
    assert reasoning and all(ln.startswith("  | ") for ln in reasoning), block
    assert re.fullmatch(r"reward: \S+.*\s+done: (yes|no)", lines[starts[4]]), lines[starts[4]]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A 1-step run of the tiny model (2 samples logged at step 0), validating at temperature 0.7."""
    d = tmp_path_factory.mktemp("play")
    return train.main(["--preset", "smoke", "--steps", "1", "--out-dir", str(d), "--name", "t", "--no-progress",
                       "--no-bf16", "--filter", "none", "--mi-every", "0", "--val-temperature", "0.7",
                       "--max-new-tokens", "8"])


def test_an_agent_plays_an_episode_turn_by_turn(capsys):
    envs.main(["frozenlake", "--seed", "3", "--play", "--agent", "tiny", "--max-new-tokens", "8"])
    out = capsys.readouterr().out
    env = envs.make_env("frozenlake")
    first = env.reset(3)
    assert "=== tiny plays frozenlake seed 3 at temperature 0.5, <= 8 new tokens a turn ===" in out  # 0.5: a name
    assert env.instructions in out and "\033[" not in out                          # no colour off a terminal
    blocks = turn_blocks(out.split("=== tiny plays", 1)[1])
    assert 1 <= len(blocks) <= env.max_turns
    for b in blocks:
        check_block(b)
    obs = blocks[0].split("observation:\n", 1)[1].split("\nreasoning:", 1)[0]
    assert obs == "\n".join("  " + ln for ln in first.splitlines())                 # the env's real first state
    dones = [re.search(r"done: (yes|no)", b).group(1) for b in blocks]
    assert dones == ["no"] * (len(blocks) - 1) + ["yes"]
    assert re.search(r"^episode: return \S+, success (True|False), ended by (done|budget|max_turns|context)$",
                     out, re.M)


def test_the_printed_turns_are_what_the_rollout_executed():
    """A scripted agent that answers FrozenLake's solution: its answers, valid actions and the goal reward show."""
    env = envs.make_env("frozenlake")
    env.reset(11)
    sol, per = env.solution, env.max_actions_per_turn

    def solver(model, tokenizer, contexts, **kw):
        k = len(re.findall(r"Turn \d+:\n", tokenizer.decode(contexts[0])))
        ids = tokenizer.encode(f" go there </think> <answer>{' || '.join(sol[(k - 1) * per:k * per])}</answer>",
                               add_special_tokens=False)
        return [(ids, [0.0] * len(ids))] * len(contexts)

    rec = envs.agent_episode("tiny", "frozenlake", {}, 11, temperature=0.9, generate_fn=solver)
    assert rec["setup"]["temperature"] == 0.9 and rec["end_reason"] == "done" and rec["success"]
    text = runlog.format_episode(rec, title="t")
    blocks = turn_blocks(text)
    assert len(blocks) == -(-len(sol) // per)
    for k, b in enumerate(blocks):
        check_block(b)
        chunk = sol[k * per:(k + 1) * per]
        assert "  | go there" in b and f"answer: {' || '.join(chunk)}\n" in b
        assert f"actions: {' || '.join(a + ' (valid)' for a in chunk)}\n" in b
    assert "reward: +1   done: yes" in blocks[-1] and "episode: return +1, success True, ended by done" in text


def test_an_agent_from_a_run_samples_at_its_validation_temperature(tiny_run, capsys):
    envs.main(["frozenlake", "--seed", "5", "--play", "--agent", str(tiny_run)])
    out = capsys.readouterr().out
    assert f"=== {tiny_run} (step 1) plays frozenlake seed 5 at temperature 0.7, <= 8 new tokens a turn ===" in out
    for b in turn_blocks(out.split(" plays frozenlake", 1)[1]):
        check_block(b)


@pytest.mark.parametrize("argv, flag", [
    (["--agent", "tiny"], "--agent"),                                      # needs --play
    (["--play", "--temperature", "0.5"], "--temperature"),                 # needs --agent
    (["--play", "--agent", "tiny", "--temperature", "0"], "--temperature"),
    (["--play", "--agent", "tiny", "--max-new-tokens", "0"], "--max-new-tokens"),
])
def test_bad_play_flags_are_refused_in_one_line(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        envs.main(["frozenlake", *argv])
    assert e.value.code == 2 and flag in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_samples_reader_prints_a_logged_step(tiny_run, capsys):
    rows = runlog.read_jsonl(tiny_run / "samples.jsonl")
    assert {r["step"] for r in rows} == {0} and len(rows) == 2
    runlog.main([str(tiny_run), "--samples"])                              # default: the last logged step
    out = capsys.readouterr().out
    heads = re.findall(r"^=== .* step 0: sample (\d)/2, group (\d+), seed (\d+) ===$", out, re.M)
    assert heads == [(str(i + 1), str(r["group"]), str(r["seed"])) for i, r in enumerate(rows)]
    assert "\033[" not in out
    for r, episode in zip(rows, out.split("\n=== ")):
        blocks = turn_blocks(episode)
        assert len(blocks) == len([m for m in r["messages"] if m["role"] == "assistant"])
        for b in blocks:
            check_block(b)
        state = r["messages"][1]["content"].split("State:\n")[1].split("\nYou have ")[0]
        assert blocks[0].split("observation:\n", 1)[1].startswith("\n".join("  " + ln for ln in state.splitlines()))
        assert f"episode: return {r['return']:+.4g}, success {r['success']}" in episode
    runlog.main([str(tiny_run), "--samples", "--step", "0", "--n", "1"])
    assert len(re.findall(r"^=== ", capsys.readouterr().out, re.M)) == 1


def test_the_samples_reader_refuses_a_step_that_was_not_logged(tiny_run, capsys):
    with pytest.raises(SystemExit) as e:
        runlog.main([str(tiny_run), "--samples", "--step", "5"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--step 5" in err and "logged steps: 0" in err


def test_logged_rewards_are_read_from_the_next_prompt():
    """samples.jsonl rows carry no per-turn rewards: turn k's is the "Reward:" line of prompt k+1, the last unknown."""
    rec = {"messages": [{"role": "system", "content": "rules"},
                        {"role": "user", "content": "Turn 1:\nState:\nP_G\nYou have 10 actions left. Always ..."},
                        {"role": "assistant", "content": "<think>right twice</think> <answer>Right</answer>"},
                        {"role": "user", "content": "Reward:\n-0.1\nTurn 2:\nState:\n_PG\nYou have 9 actions left."},
                        {"role": "assistant", "content": "<think>again"}],
           "actions": [["Right"], []], "return": -0.2, "success": False}
    t1, t2 = runlog.episode_turns(rec)
    assert (t1["observation"], t1["reasoning"], t1["answer"], t1["reward"], t1["done"]) == \
        ("P_G", "right twice", "Right", -0.1, False)
    assert (t2["observation"], t2["reasoning"], t2["answer"], t2["reward"], t2["done"]) == \
        ("_PG", "again", None, None, True)
    text = runlog.format_episode(rec, color=True)
    assert "\033[" in text and "format error" in text and "(not logged)" in text
