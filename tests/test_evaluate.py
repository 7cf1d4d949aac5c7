"""evaluate.py, and a user environment through the whole project (issue 25): an Env class written outside the
repository trains (train.py --env file.py:Class), resumes, is evaluated from the run, from its export and by model
name on any seeds without touching the run's logs; bad requests are one-line refusals before any model loads.
Run: .venv/bin/python -m pytest tests/test_evaluate.py -q   (tiny model, ~1 min)
"""
import json

import pytest

import config
import evaluate
import export
import runlog
import train
from test_envs import write_user_env


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("user")
    env = f"{write_user_env(d)}:Guess"
    common = ["--preset", "smoke", "--env", env, "--env-options", '{"hi": 3}', "--out-dir", str(d / "runs"),
              "--name", "guess", "--filter", "none", "--mi-every", "0", "--no-progress"]
    run = train.main([*common, "--steps", "1"])
    resumed = train.main(["--resume", str(run), "--steps", "2", "--no-progress"])
    return resumed, env, d


def test_a_user_env_trains_and_resumes(user_run):
    run, env, _ = user_run
    rows = runlog.read_metrics(run)
    assert [r["step"] for r in rows] == [-1, 0, 1]                                    # validation before step 0
    assert runlog.load_checkpoint(run)["step"] == 2 and runlog.load_config(run)["env"] == env
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert "Guess my number between 0 and 3." in sample["messages"][0]["content"]


def test_evaluate_a_run_on_other_seeds_leaves_its_logs_alone(user_run):
    run, _, _ = user_run
    before = {p: (run / p).read_bytes() for p in ("metrics.jsonl", "samples.jsonl", "config.json")}
    out = evaluate.main([str(run), "--seeds", "5000:5006", "--temperature", "0.7", "--mi", "--samples", "2",
                         "--tag", "t"])
    assert out == run / "eval-t.json"
    res = json.loads(out.read_text())
    s = res["setup"]
    assert (s["seeds"], s["episodes"], s["temperature"], s["step"], s["kind"]) == ([5000, 5006], 6, 0.7, 2, "run")
    for key in ("success", "format_ok_rate", "valid_action_rate", "turns", "return"):
        assert key in res["metrics"]
    assert res["metrics"]["num_trajectories"] == 6 and sum(res["end_reasons"].values()) == 6
    assert {"first_turn", "trajectory"} <= set(res["mi"]) and len(res["samples"]) == 2
    assert [x["seed"] for x in res["samples"]] == [5000, 5001]
    assert before == {p: (run / p).read_bytes() for p in before}                     # not a training step
    with pytest.raises(SystemExit) as e:                                              # no silent overwrite
        evaluate.main([str(run), "--seeds", "5000:5006", "--temperature", "0.7", "--tag", "t"])
    assert e.value.code == 2


def test_an_export_evaluates_like_its_run(user_run, tmp_path):
    run, env, _ = user_run
    hf = export.export(run, tmp_path / "hf")
    args = ["--seeds", "7:11", "--temperature", "1.0", "--samples", "4"]
    a = json.loads(evaluate.main([str(run), *args, "--out", str(tmp_path / "a.json")]).read_text())
    b = json.loads(evaluate.main([str(hf), "--env", env, "--env-options", '{"hi": 3}', "--max-new-tokens", "8",
                                  "--no-bf16", *args]).read_text())
    assert b["setup"]["kind"] == "dir" and (hf / "eval-my_guess.Guess-7-11-t1.json").is_file()
    assert a["metrics"] == b["metrics"] and a["samples"] == b["samples"]            # the same policy, same draws


@pytest.mark.parametrize("argv, match", [
    (["tiny", "--seeds", "0:4"], "--env: required"),
    (["tiny", "--env", "bandit", "--seeds", "4:2"], "--seeds"),
    (["tiny", "--env", "bandit", "--seeds", "a:b"], "--seeds"),
    (["tiny", "--env", "chess"], "--env"),
    (["tiny", "--env", "bandit", "--env-options", '{"arms": 3}'], "--env-options"),
    (["tiny", "--env", "bandit", "--temperature", "0"], "--temperature"),
    (["tiny", "--env", "bandit", "--seeds", "0:4", "--episodes", "3"], "--episodes"),
    (["nobody/nothing-xyz", "--env", "bandit"], None),            # checked when loading: see test_policy
])
def test_bad_evaluations_are_refused_before_loading(argv, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if match is None:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        with pytest.raises(SystemExit) as e:
            evaluate.main(argv)
        assert e.value.code == 2
    else:
        with pytest.raises(config.UsageError, match=match):
            evaluate.plan(argv)
    assert not list(tmp_path.iterdir())                                               # nothing written


def test_a_runs_default_evaluation_uses_its_validation_env_options(tmp_path):
    """`evaluate.py RUN` without --env-options evaluates the run's validation envs (--val-env-options merged over
    --env-options, e.g. the Bandit's test split); an explicit --env-options replaces both."""
    import dataclasses
    args, _ = config.resolve(["--model", "tiny", "--env", "bandit", "--env-options", '{"payout": "deterministic"}',
                              "--val-env-options", '{"split": "test"}'])
    run = tmp_path / "run"
    (run / "checkpoints" / "last").mkdir(parents=True)
    (run / "checkpoints" / "last" / "rank0.pt").write_bytes(b"")         # plan() only checks that it exists
    (run / "config.json").write_text(json.dumps({"flags": dataclasses.asdict(args), "env": {}}))
    o, a, seeds, kind, out = evaluate.plan([str(run)])
    assert kind == "run" and json.loads(a.env_options) == {"payout": "deterministic", "split": "test"}
    assert seeds == list(range(a.val_seed, a.val_seed + a.val_envs))
    o, a, *_ = evaluate.plan([str(run), "--env-options", '{"payout": "bernoulli"}'])
    assert json.loads(a.env_options) == {"payout": "bernoulli"}
