"""Faults and hostile inputs (tiny model): kill -9 then --resume equals an uninterrupted run; SIGTERM leaves a
resumable checkpoint; two runs on one name; torn log lines; missing or corrupt checkpoints; refused flags leave
nothing behind; a diverged run stops with valid JSON logs. (Hostile Countdown / MetaMathQA answers: test_envs.py.)"""
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import config
import report
import runlog
import train

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--preset", "smoke", "--env", "bandit", "--algo", "grpo", "--filter", "none", "--mi-every", "0",
          "--eval-every", "0", "--save-every", "1", "--no-progress"]


def run(out, name, *extra):
    return train.main([*COMMON, "--out-dir", str(out), "--name", name, *extra])


def params(run_dir):
    return runlog.load_checkpoint(run_dir)["model"]


def same_metrics(a, b):
    """Every logged value except timings equal, step by step."""
    ra, rb = runlog.read_metrics(a), runlog.read_metrics(b)
    strip = [[{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows] for rows in (ra, rb)]
    return strip[0] == strip[1]


def wait_for(predicate, timeout=120.0):
    t0 = time.time()
    while not predicate():
        if time.time() - t0 > timeout:
            raise TimeoutError("condition not reached")
        time.sleep(0.2)


def spawn(out, name, *extra):
    return subprocess.Popen([sys.executable, "train.py", *COMMON, "--out-dir", str(out), "--name", name, *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_kill_9_then_resume_equals_an_uninterrupted_run(tmp_path):
    full = run(tmp_path, "full", "--steps", "4")
    p = spawn(tmp_path, "killed", "--steps", "4")
    d = tmp_path / "killed"
    wait_for(lambda: len(runlog.read_metrics(d)) >= 2 or p.poll() is not None)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (d / "finished.json").exists()
    train.main(["--resume", str(d), "--no-progress"])
    assert same_metrics(full, d)
    a, b = params(full), params(d)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_checkpoints_and_exits_nonzero_then_resumes_exactly(tmp_path, monkeypatch):
    """SIGTERM (timeouts, schedulers, preemption) is handled like Ctrl-C: the step in flight finishes, a checkpoint
    is saved, the exit status is 128 + 15, and --resume continues to the same result as an uninterrupted run."""
    full = run(tmp_path, "full", "--steps", "3")
    real_log = runlog.RunLog.log
    before = signal.getsignal(signal.SIGTERM)

    def log_then_term(self, step, metrics):
        real_log(self, step, metrics)
        if step == 0 and self.dir.name == "term":
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(runlog.RunLog, "log", log_then_term)
    with pytest.raises(SystemExit) as exc:
        run(tmp_path, "term", "--steps", "3")
    assert exc.value.code == 128 + signal.SIGTERM
    d = tmp_path / "term"
    assert runlog.load_checkpoint(d)["step"] == 1 and not (d / "finished.json").exists()
    monkeypatch.setattr(runlog.RunLog, "log", real_log)
    assert signal.getsignal(signal.SIGTERM) is before                   # the handler is restored
    train.main(["--resume", str(d), "--no-progress"])
    assert same_metrics(full, d) and (d / "finished.json").exists()


@pytest.mark.slow
def test_second_run_on_the_same_name_is_refused_and_the_first_stays_intact(tmp_path):
    p = spawn(tmp_path, "shared", "--steps", "4")
    d = tmp_path / "shared"
    wait_for(lambda: (d / "config.json").exists() or p.poll() is not None)
    with pytest.raises(ValueError, match="in use by pid|already holds a run"):
        run(tmp_path, "shared", "--steps", "4", "--seed", "1")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert [r["step"] for r in runlog.read_metrics(d)] == [0, 1, 2, 3]
    assert json.loads((d / "config.json").read_text())["flags"]["seed"] == 0
    assert json.loads((d / "finished.json").read_text())["step"] == 4
    # the lock died with its holder: a later resume of the finished run is not blocked
    train.main(["--resume", str(d), "--steps", "5", "--no-progress"])
    assert [r["step"] for r in runlog.read_metrics(d)] == [0, 1, 2, 3, 4]


def test_a_locked_run_directory_is_refused_until_its_holder_dies(tmp_path):
    """The run-directory lock itself: while another process holds <run>/.lock, train.py refuses (one line, nothing
    written); once the holder is gone (even killed), the run starts."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time, runlog; lock = runlog.RunLock(sys.argv[1]); "
                               "print('held', flush=True); time.sleep(120)", str(tmp_path / "busy")],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(config.UsageError, match=f"in use by pid {holder.pid}"):
        run(tmp_path, "busy", "--steps", "1")
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == [".lock"]
    holder.kill()
    holder.wait()
    run(tmp_path, "busy", "--steps", "1")
    assert (tmp_path / "busy" / "finished.json").exists()


def test_torn_last_lines_are_skipped_and_resume_truncates(tmp_path):
    d = run(tmp_path, "torn", "--steps", "2", "--save-every", "1")
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "rollout/succ')                        # power loss mid-write
    with open(d / "samples.jsonl", "a") as f:
        f.write('{"step": 2, "mess')
    with pytest.warns(UserWarning, match="metrics.jsonl: line 3 is torn"):
        assert [r["step"] for r in runlog.read_metrics(d)] == [0, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report.main([str(d)])                                        # the report reads it too
    (d / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, bad\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not valid JSON"):
        runlog.read_metrics(d)


def test_torn_logs_then_resume_to_more_steps(tmp_path):
    d = run(tmp_path, "r", "--steps", "2")
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "rollout/succ')
    with open(d / "samples.jsonl", "a") as f:
        f.write('{"step": 2, "mess')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train.main(["--resume", str(d), "--steps", "3", "--no-progress"])
    assert [r["step"] for r in runlog.read_metrics(d)] == [0, 1, 2]    # the torn line is gone, step 2 is real
    for line in (d / "samples.jsonl").read_text().splitlines():
        json.loads(line)


def test_corrupt_last_checkpoint_falls_back_to_the_previous_one(tmp_path):
    d = run(tmp_path, "c", "--steps", "3", "--save-every", "1")
    assert runlog.load_checkpoint(d)["step"] == 3
    (d / "checkpoints" / "last" / "rank0.pt").write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="falling back to the previous checkpoint"):
        assert runlog.load_checkpoint(d)["step"] == 2
    (d / "checkpoints" / "prev" / "rank0.pt").write_bytes(b"nor this")
    with pytest.raises(ValueError, match="no readable checkpoint"):
        runlog.load_checkpoint(d)


@pytest.mark.parametrize("flags, names", [
    (["--lr", "inf"], "--lr"), (["--kl-coef", "nan"], "--kl-coef"), (["--entropy-coef", "inf"], "--entropy-coef"),
    (["--seed", "-1"], "--seed"), (["--train-seed", "-5"], "--train-seed"), (["--max-turns", "-1"], "--max-turns"),
    (["--max-new-tokens", "0"], "--max-new-tokens"), (["--model", "./no/such/model"], "--model"),
    (["--env", "frozenlake", "--env-options", '{"slip": 2}'], "--env-options: slip"), (["--groups", "0"], "--groups"),
])
def test_refused_flags_name_the_flag_and_leave_nothing_behind(tmp_path, flags, names):
    with pytest.raises(config.UsageError, match=names):
        run(tmp_path, "refused", *flags)
    assert not (tmp_path / "refused").exists()


def test_refused_command_line_is_one_line_without_traceback(tmp_path):
    p = subprocess.run([sys.executable, "train.py", "--lr", "inf", "--out-dir", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip() == "error: --lr: must be a finite number, got inf"
    assert not any(tmp_path.iterdir())


def test_unloadable_model_leaves_no_run_directory(tmp_path, monkeypatch):
    import policy

    def fail(*a, **k):
        raise ValueError("could not load model 'owner/missing'")
    monkeypatch.setattr(policy, "load", fail)
    with pytest.raises(ValueError, match="could not load"):
        run(tmp_path, "nomodel", "--model", "owner/missing")
    assert not (tmp_path / "nomodel").exists()


def test_diverging_run_warns_stops_and_writes_valid_json(tmp_path, capsys):
    d = run(tmp_path, "div", "--steps", "8", "--lr", "1e30", "--stop-nonfinite", "2")
    out = capsys.readouterr().out
    assert "optimizer steps skipped (non-finite gradient norm" in out and "--stop-nonfinite 0" in out
    rows = runlog.read_metrics(d)
    assert rows[-1].get("early_stopped/nonfinite_updates") == 1.0 and len(rows) < 8
    for line in (d / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.jsonl"))
