"""experiments/paper.py drivers: generated commands (dilution control), and the classroom protocol end to end on
the tiny model (--scale smoke): runs, page, skip of finished runs, --resume of an interrupted one."""
import json
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


@pytest.mark.slow
def test_classroom_protocol_smoke_runs_resumes_and_writes_the_page(tmp_path, capfd):
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
