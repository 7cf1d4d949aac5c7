"""experiments/warmstart.py: the teacher reads the observation the model sees, plans a safe shortest path, fits the
turn budget, its episodes are the rollout's own, and the supervised step lowers the loss on the teacher's tokens."""
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import envs
import policy
import rollout

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import warmstart  # noqa: E402


@pytest.mark.parametrize("seed", [1, 7, 40, 41, 42, 43])
def test_read_state_recovers_the_env_and_the_teacher_plans_a_safe_shortest_path(seed):
    env = envs.make_env("frozenlake")
    obs = env.reset(seed)
    size, player, goal, holes = warmstart.read_state("older text\nBoard size: 9 rows x 9 cols\n" + obs)
    assert (size, player, goal) == (env.size, env.player, env.goal)
    assert sorted(holes) == sorted(tuple(int(v) for v in c) for c in np.argwhere(env.holes))
    reply = warmstart.teacher_turn(obs, 2, random.Random(0))
    answer = reply.split("<answer>")[1].split("</answer>")[0]
    assert answer == " || ".join(env.solution[:2])                  # BFS shortest path, first two moves
    assert reply.count("</think>") == 1 and reply.endswith("</answer>")
    short = warmstart.teacher_turn(obs, 2, random.Random(0), fits=lambda s: len(s) < 60)
    assert len(short) < 60 or short.startswith(" Next:")             # the budget drops detail, never the answer
    assert short.split("<answer>")[1] == reply.split("<answer>")[1]


def test_teacher_episodes_are_rollouts_that_solve_the_maps_and_sft_lowers_the_loss(tmp_path):
    model, tok = policy.load("tiny", seed=0)
    cfg = rollout.RolloutConfig(env="frozenlake", max_turns=3, max_new_tokens=48, bf16=False)
    trajs = warmstart.demonstrations(model, tok, cfg, 12)
    assert [t.seed for t in trajs] == [warmstart.DEMO_SEED + i for i in range(12)]
    for t in trajs:
        env = envs.make_env("frozenlake", max_turns=3)
        env.reset(t.seed)
        if len(env.solution) <= 6:                                   # solvable within 3 turns x 2 moves
            assert t.success and t.end_reason == "done"
        assert all(turn.format_ok and len(turn.gen_ids) < 48 for turn in t.turns)
        assert "at most 3 turns" in t.messages[0]["content"]          # the protocol's prompt, budgets stated
    texts = {turn.text.split("</think>")[0] for t in trajs for turn in t.turns}
    assert len(texts) == sum(len(t.turns) for t in trajs)            # reasonings differ with the map
    torch.manual_seed(0)
    losses = warmstart.sft(model, tok, trajs, epochs=3, lr=3e-3, micro_batch=4)
    assert losses[-1] < losses[0]


def test_main_writes_a_model_train_loads_and_refuses_bad_input(tmp_path, capsys):
    out = tmp_path / "warm"
    warmstart.main([str(out), "--model", "tiny", "--episodes", "2", "--epochs", "1", "--max-turns", "2"])
    info = json.loads((out / "warmstart.json").read_text())
    assert info["episodes"] == 2 and info["max_turns"] == 2 and len(info["loss_per_epoch"]) == 1
    import hashlib
    assert info["sha256"] == hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    model, _ = policy.load(str(out))
    assert isinstance(model, torch.nn.Module)
    for argv, flag in [([str(out)], "not empty"), ([str(tmp_path / "x"), "--episodes", "0"], "--episodes"),
                       ([str(tmp_path / "y"), "--lr", "0"], "--lr"),
                       ([str(tmp_path / "z"), "--env-options", '{"slipp": 1}'], "--env-options")]:
        with pytest.raises(SystemExit):
            warmstart.main(argv)
        assert flag in capsys.readouterr().err
        assert not (tmp_path / "x").exists()
