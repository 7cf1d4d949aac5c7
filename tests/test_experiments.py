"""experiments/paper.py drivers: generated commands (dilution control), and the classroom protocol end to end on
the tiny model (--scale smoke): runs, page, skip of finished runs, --resume of an interrupted one."""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import config
import runlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import paper  # noqa: E402


def resolved(argv, diluted="0.5"):
    return config.resolve([diluted if a == "@diluted" else a for a in argv])[0]


def test_dilution_control_uses_the_explicit_entropy_coef_as_its_base(tmp_path):
    """--entropy-coef X: the filter and no-filter arms run with X, the diluted arm with X x kept fraction (the
    explicit flag must not override the placeholder, which would make the control equal to no filter)."""
    for exp in ("dilution_control", "classroom"):
        todo = dict(paper.runs(exp, "cpu", [3], ["--entropy-coef", "0.02"], str(tmp_path)))
        assert resolved(todo[f"{exp}-filter-s3"]).entropy_coef == 0.02
        assert resolved(todo[f"{exp}-nofilter-s3"]).entropy_coef == 0.02
        diluted = todo[f"{exp}-nofilter-diluted-s3"]
        assert diluted.count("--entropy-coef") == 1 and resolved(diluted, "0.0075").entropy_coef == 0.0075
        assert paper.entropy_base("cpu", ["--entropy-coef=0.02"]) == 0.02
    assert paper.entropy_base("cpu", []) == config.Args.entropy_coef
    # base x mean kept fraction of the same seed's filter run (empty steps count as 0)
    log = runlog.RunLog(tmp_path / "classroom-filter-s3")
    for step, kept in enumerate([0.5, 0.25, 0.0, 0.75]):
        log.log(step, {"filter/kept_frac": kept})
    log.close()
    assert float(paper.diluted_entropy(str(tmp_path), "classroom", 3, 0.02)) == pytest.approx(0.02 * 0.375)
    with pytest.raises(SystemExit, match="seed 4"):
        paper.diluted_entropy(str(tmp_path), "classroom", 4, 0.02)


def test_classroom_defaults_and_dry_run(capsys):
    paper.main(["classroom", "--dry-run", "--seeds", "0"])
    out = capsys.readouterr().out
    assert "--out-dir experiments/classroom" in out and "--page experiments/RESULTS.md" in out
    assert out.count("train.py") == 3 and "--pairs classroom-filter:classroom-nofilter," in out
    a = resolved(paper.runs("classroom", "classroom", [0], [], "x")[0][1])
    assert (a.env, json.loads(a.env_options), a.model, a.mi_scorer, a.filter) == (
        "bandit", {"payout": "deterministic"}, "smollm2-135m", "both", "top_p")


def test_protocol_setting_seeds_and_one_value_per_flag(capsys):
    """`protocol` is the classroom scale at the regime search's Dr.GRPO pilot: 6 seeds by default, each flag once
    in the command (the override replaces the classroom value, it does not shadow it), validation on the test split,
    and the dilution arm's base is the protocol's entropy coefficient (0.01), not the classroom's (0.001)."""
    paper.main(["protocol", "--dry-run"])
    out = capsys.readouterr().out
    assert out.count("train.py") == 18 and "--page experiments/PROTOCOL.md" in out
    assert "--out-dir experiments/protocol" in out and "--calibration experiments/calibration.json" in out
    todo = dict(paper.runs("protocol", "protocol", [4], [], "x"))
    argv = todo["protocol-nofilter-s4"]
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) == len(set(flags)), "a flag given twice"
    a = resolved(argv)
    assert (a.algo, a.lr, a.entropy_coef, a.steps, a.val_envs, json.loads(a.val_env_options), a.filter) == (
        "drgrpo", 5e-6, 0.01, 24, 64, {"split": "test"}, "none")
    assert (a.mi_every, a.eval_every, a.group_size, a.temperature) == (4, 8, 8, 0.7)   # the rest: classroom's
    assert resolved(todo["protocol-filter-s4"]).filter == "top_p"
    assert paper.entropy_base("protocol", []) == 0.01
    assert paper.override(["--a", "1", "--b", "2"], ["--a", "3"]) == ["--b", "2", "--a", "3"]
    with pytest.raises(SystemExit):
        paper.main(["slip_sweep", "--scale", "protocol", "--dry-run"])    # a Bandit test-split scale for FrozenLake


@pytest.fixture
def in_process(monkeypatch):
    """The drivers launch train.py, report.py and experiments/warmstart.py as processes (cwd = the checkout); in the
    smoke tests they run in this process instead (the same main(argv), about 4 s of imports saved per launch), so
    these tests check the drivers' skipping, resuming, records and pages, not process isolation."""
    import importlib
    real = paper.subprocess.run
    modules = {"train.py": "train", "report.py": "report", "experiments/warmstart.py": "warmstart"}
    monkeypatch.chdir(paper.ROOT)

    def run(cmd, *args, **kw):
        if cmd[0] != sys.executable or cmd[1] not in modules:
            return real(cmd, *args, **kw)
        assert kw.get("cwd") == paper.ROOT, "the drivers run their scripts in the checkout"
        importlib.import_module(modules[cmd[1]]).main([str(a) for a in cmd[2:]])
        return paper.subprocess.CompletedProcess(cmd, 0)
    monkeypatch.setattr(paper.subprocess, "run", run)


@pytest.mark.slow
def test_classroom_protocol_smoke_runs_resumes_and_writes_the_page(tmp_path, capfd, in_process):
    out, page = tmp_path / "runs", tmp_path / "RESULTS.md"
    argv = ["classroom", "--scale", "smoke", "--seeds", "0", "1", "--out-dir", str(out), "--page", str(page)]
    paper.main(argv)
    names = [f"classroom-{arm}-s{s}" for arm in ("filter", "nofilter", "nofilter-diluted") for s in (0, 1)]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(names)
    assert all((out / n / "finished.json").exists() for n in names)
    text = page.read_text()
    for label in ("classroom-filter", "classroom-nofilter", "classroom-nofilter-diluted"):
        assert f"| {label} | 2 |" in text
    assert "| classroom-filter − classroom-nofilter | 2 |" in text and page.with_suffix(".png").exists()
    capfd.readouterr()
    # an interrupted run (no finished.json) is continued with --resume; finished ones are skipped
    (out / "classroom-nofilter-s1" / "finished.json").unlink()
    paper.main(argv)
    printed = capfd.readouterr().out
    assert printed.count("# done:") == 5 and f"--resume {out / 'classroom-nofilter-s1'}" in printed
    assert (out / "classroom-nofilter-s1" / "finished.json").exists()
    assert [r["step"] for r in runlog.read_metrics(out / "classroom-nofilter-s1")] == [-1, 0, 1]


def test_multiturn_and_slip_boundary_defaults_and_dry_run(capsys, tmp_path):
    paper.main(["slip_boundary", "--dry-run", "--seeds", "0"])
    out = capsys.readouterr().out
    assert "experiments/warmstart.py experiments/multiturn/warm-model" in out and "--page experiments/SLIP.md" in out
    w = str(tmp_path)                                                # any local directory is a model name
    todo = dict(paper.runs("slip_boundary", "multiturn", [0], [], "x", ["--model", w]))
    for s in (0.0, 0.2, 0.5):
        a = resolved(todo[f"slip_boundary-slip{s}-filter-s0"])
        assert (a.env, json.loads(a.env_options), a.model, a.max_turns, a.filter) == (
            "frozenlake", {"slip": s}, w, 3, "top_p")
        assert resolved(todo[f"slip_boundary-slip{s}-nofilter-s0"]).filter == "none"
    a = resolved(paper.runs("multiturn", "multiturn", [1], [], "x", ["--model", w])[0][1])
    assert (a.algo, a.max_new_tokens, a.groups, a.group_size, a.val_envs, a.mi_families, a.prompt_budgets) == (
        "drgrpo", 48, 4, 8, 64, "first_turn,trajectory", "rollout")
    assert (a.steps, a.mi_every, a.eval_every) == (16, 4, 8)      # MI at steps 0, 3, 7, 11, 15; val at 7, 15
    with pytest.raises(SystemExit):
        paper.main(["multiturn", "--scale", "cpu", "--dry-run"])      # a Bandit scale for a FrozenLake protocol


def test_an_interrupted_launch_still_records_its_wall_time(tmp_path, monkeypatch):
    def killed(*a, **kw):
        raise KeyboardInterrupt                                      # or SystemExit from the driver's SIGTERM handler
    monkeypatch.setattr(paper.subprocess, "run", killed)
    with pytest.raises(KeyboardInterrupt):
        paper.timed_run(["train.py", "--resume", "x"], "arm-s0", tmp_path)
    [w] = runlog.read_jsonl(tmp_path / "walltime.jsonl")
    assert (w["run"], w["resumed"], w["interrupted"]) == ("arm-s0", True, True) and w["seconds"] >= 0


@pytest.mark.slow
def test_multiturn_protocol_smoke_warm_start_baseline_resume_and_page(tmp_path, capfd, in_process):
    out, page = tmp_path / "runs", tmp_path / "MULTITURN.md"
    argv = ["multiturn", "--scale", "smoke", "--seeds", "0", "--out-dir", str(out), "--page", str(page)]
    paper.main(argv)
    names = [f"multiturn-{arm}-s0" for arm in ("filter", "nofilter", "nofilter-diluted")]
    assert all((out / n / "finished.json").exists() for n in names)
    warm = json.loads((out / "warm-model" / "warmstart.json").read_text())
    assert warm["model"] == "tiny" and warm["max_turns"] == 2 and warm["teacher_success"] > 0
    for n in names:                                                   # every arm starts from the warm start
        assert json.loads((out / n / "config.json").read_text())["flags"]["model"] == str(out / "warm-model")
    base = json.loads((out / "agnostic.json").read_text())
    assert base["seeds"] == [123, 127] and base["env_options"] == {"max_turns": 2}
    text = page.read_text()
    assert "## Input-agnostic baseline" in text and f"succeeds on {base['successes']} of 4" in text
    assert "| multiturn-filter | 1 | s0: " in text and "| multiturn-nofilter | 1 |" in text
    assert "rollout/success_by_turn1" in text and page.with_suffix(".png").exists()
    capfd.readouterr()
    (out / "multiturn-nofilter-s0" / "finished.json").unlink()      # interrupted: continued with --resume
    paper.main(argv)
    printed = capfd.readouterr().out
    assert printed.count("# done:") == 4 and f"--resume {out / 'multiturn-nofilter-s0'}" in printed   # warm, baseline, 2 runs
    assert [r["step"] for r in runlog.read_metrics(out / "multiturn-nofilter-s0")] == [-1, 0, 1]
    shutil.copytree(out / "multiturn-filter-s0", out / "multiturn-filter-s1")   # a seed finished by another call
    shutil.copytree(out / "multiturn-filter-s0", out / "multiturn-nofilter-s1")
    (out / "multiturn-nofilter-s1" / "finished.json").unlink()                  # ... and one that is not finished
    paper.main(argv)                                                 # --seeds 0 again: the page keeps seed 1
    assert "| multiturn-filter | 2 |" in page.read_text() and "| multiturn-nofilter | 1 |" in page.read_text()
    shutil.rmtree(out / "multiturn-filter-s1")
    shutil.rmtree(out / "multiturn-nofilter-s1")
    wall = runlog.read_jsonl(out / "walltime.jsonl")                  # measured per launch, the resume its own line
    assert [(w["run"], w["resumed"]) for w in wall] == [(n, False) for n in names] + [(names[1], True)]
    assert all(w["seconds"] > 0 and "cores" in w["cpu"] for w in wall)
    (out / "warm-model" / "model.safetensors").unlink()             # a new checkout: the record without the weights
    capfd.readouterr()
    paper.main(argv)                                                 # rebuilt, and the same weights (deterministic)
    assert "warm-model: rebuilt, the recorded weights (same sha256)" in capfd.readouterr().out
    assert json.loads((out / "warm-model" / "warmstart.json").read_text())["sha256"] == warm["sha256"]
    (out / "warm-model" / "model.safetensors").unlink()
    assert warm["delta_norms"]["model.embed_tokens.weight"] > 0                 # the fine-tuning moved the weights
    other_cpu = {**warm, "sha256": "0" * 64, "delta_norms": {k: v * (1 + 1e-5) for k, v in warm["delta_norms"].items()}}
    (out / "warm-model" / "warmstart.json").write_text(json.dumps(other_cpu))  # another CPU's kernels: rounding
    paper.main(argv)
    assert "the recorded weights up to fp32 rounding" in capfd.readouterr().out
    assert json.loads((out / "warm-model" / "warmstart.json").read_text()) == other_cpu            # record kept
    (out / "warm-model" / "model.safetensors").unlink()
    name = "model.embed_tokens.weight"
    changed = {**other_cpu, "delta_norms": {**other_cpu["delta_norms"], name: other_cpu["delta_norms"][name] * 1.01}}
    (out / "warm-model" / "warmstart.json").write_text(json.dumps(changed))    # another warm start
    started = "multiturn-filter-s0, multiturn-nofilter-diluted-s0, multiturn-nofilter-s0 started"
    with pytest.raises(SystemExit, match=f"is not the one the runs {started}"):
        paper.main(argv)                                             # runs started from other weights: refused
    assert json.loads((out / "warm-model" / "warmstart.json").read_text()) == changed               # record kept
    assert not (out / "warm-model.old").exists()
    (out / "warm-model" / "warmstart.json").write_text(json.dumps({k: v for k, v in warm.items()
                                                                   if k not in ("sha256", "delta_norms")}))
    capfd.readouterr()
    paper.main(argv)                           # a record from before the fingerprint: judged by data and losses,
    assert "the recorded weights (same sha256)" not in capfd.readouterr().out                # then fingerprinted
    rec = json.loads((out / "warm-model" / "warmstart.json").read_text())
    assert rec["sha256"] == warm["sha256"] and rec["delta_norms"] == warm["delta_norms"] and "fingerprint" in rec


def test_reasoning_texts_counts_placeholders_and_distinct_texts_on_a_worked_example(tmp_path, capsys):
    import reasoning_texts

    def sample(step, text):
        return {"step": step, "messages": [{"role": "system", "content": "<think>[Your thoughts]</think> in a rule"},
                                           {"role": "user", "content": "Turn 1"},
                                           {"role": "assistant", "content": text}]}
    rows = [sample(3, "<think>[Your thoughts]</think> <answer>A</answer>"),       # outside the steps
            sample(16, "<think> [Your thoughts] </think> <answer>A</answer>"),
            sample(16, "<think>[your reasoning] and more</think><answer>B</answer>"),
            sample(17, "<think>Nurse is safer</think> <answer>Nurse</answer>"),
            sample(17, "<think>Nurse is safer</think> <answer>Nurse</answer>"),
            sample(18, "<think>I think [Your thoughts]</think>"),                  # not at the start: reasoning
            sample(23, "<think>cut off before the closing tag"),
            sample(24, "<think>[Your thoughts]</think>")]                          # HI is exclusive
    run = tmp_path / "run-a"
    run.mkdir()
    (run / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 2, "mess')  # torn line
    [s] = reasoning_texts.main([str(run), "--steps", "16:24"])
    assert s == {"run": "run-a", "samples": 6, "placeholder": 2, "distinct": 4, "no_think": 1,
                 "most_common": "Nurse is safer", "most_common_count": 2}
    assert "| run-a | 6 | 2 | 4 | 1 | Nurse is safer (2) |" in capsys.readouterr().out
    for bad in (["--steps", "5:5"], ["--steps", "x"]):
        with pytest.raises(SystemExit):
            reasoning_texts.main([str(run), *bad])
    with pytest.raises(SystemExit):
        reasoning_texts.main([str(tmp_path / "nothing")])


def test_same_warm_start_tells_identical_rounding_and_other():
    import warmstart
    rec = {"sha256": "a" * 64, "delta_norms": {"w": 10.0, "b": 0.5, "still": 0.0}, "model": "m", "seed": 0,
           "env_options": {},
           "max_turns": 3, "max_new_tokens": 48, "episodes": 64, "demo_seeds": [1, 65], "epochs": 2, "lr": 1e-4,
           "micro_batch": 8, "teacher_tokens": 3911, "loss_per_epoch": [1.1, 0.24]}
    assert warmstart.same_warm_start(rec, dict(rec)) == "identical"
    other = {**rec, "sha256": "b" * 64}
    rounded = {"w": 10.005, "b": 0.5, "still": 4e-7}                        # 5e-4 relative; a negligible update
    assert warmstart.same_warm_start(rec, {**other, "delta_norms": rounded}) == "rounding"
    assert warmstart.same_warm_start(rec, {**other, "delta_norms": {**rounded, "w": 10.02}}) == ""       # 2e-3
    assert warmstart.same_warm_start(rec, {**other, "delta_norms": {**rounded, "still": 0.01}}) == ""   # it moved
    assert warmstart.same_warm_start(rec, {**other, "delta_norms": {"w": 10.0, "b": 0.5}}) == ""       # one less
    assert warmstart.same_warm_start(rec, {**other, "loss_per_epoch": [1.1, 0.25]}) == ""
    assert warmstart.same_warm_start(rec, {**other, "teacher_tokens": 3912}) == ""                   # other data
    assert warmstart.same_warm_start(rec, {**other, "lr": 2e-4}) == ""
    old = {k: v for k, v in rec.items() if k not in ("sha256", "delta_norms")}   # a record from before them
    assert warmstart.same_warm_start(old, other) == "rounding"                # judged by data and losses alone


def test_started_from_compares_resolved_paths_and_fails_closed(tmp_path, monkeypatch):
    import torch
    import warmstart
    out = tmp_path / "exp"
    for name, model in (("a", str(out / "warm-model")), ("b", str(out / "x" / ".." / "warm-model")),
                        ("c", "smollm2-135m")):
        (out / name).mkdir(parents=True)
        (out / name / "config.json").write_text(json.dumps({"flags": {"model": model}}))
    (out / "torn").mkdir()
    (out / "torn" / "config.json").write_text('{"flags": {"mod')
    assert paper.started_from(out / "warm-model", out) == ["a", "b", "torn"]
    monkeypatch.chdir(tmp_path)                      # a relative --model resolves against the checkout, not the cwd
    relative = os.path.relpath(out / "warm-model", paper.ROOT)
    (out / "c" / "config.json").write_text(json.dumps({"flags": {"model": relative}}))
    assert paper.started_from(out / "warm-model", out) == ["a", "b", "c", "torn"]
    lin = torch.nn.Linear(2, 2, bias=False)
    base = {k: v.detach().clone() for k, v in lin.state_dict().items()}
    with torch.no_grad():
        lin.weight.add_(torch.tensor([[3.0, 0.0], [0.0, 4.0]]))
    assert warmstart.update_norms(base, lin) == {"weight": 5.0}
