"""report.plot_regime_map (the paper's Fig. 1 from measurements): a figure for one run and for a set of runs (the
committed classroom runs), the region splits from the calibration points, the run's path on the steps that logged
both axes, plot_run's regime_map.png and the page section."""
import json
import shutil
from pathlib import Path

import pytest

import report

ROOT = Path(__file__).resolve().parents[1]
CLASSROOM = sorted((ROOT / "experiments" / "classroom").glob("classroom-*"))
POINTS = [("healthy", 0.30, 1.5), ("template", -0.02, 1.6), ("fixed", -0.01, 0.1), ("mix0.5", 0.12, 1.55)]


def needs_classroom():
    if not CLASSROOM:
        pytest.skip("no committed classroom runs")


def test_splits_are_halfway_between_calibration_batches():
    assert report.regime_splits(POINTS) == pytest.approx(((0.30 - 0.02) / 2, (1.5 + 0.1) / 2))
    assert report.regime_splits([]) == (0.1, 0.5)                              # documented defaults
    assert report.regime_splits([("healthy", 1.0, 2.0)]) == (0.1, 0.5)


def test_path_uses_the_steps_that_logged_both_axes():
    rows = [{"step": -1, report.REGIME_X: 9.0, report.REGIME_Y: 9.0},              # before training: not a step
            {"step": 0, report.REGIME_X: 0.2, report.REGIME_Y: 1.4},
            {"step": 1, report.REGIME_X: 0.3},                                     # only one axis
            {"step": 2, report.REGIME_X: 0.5, report.REGIME_Y: 0.4, "train/entropy": 0.1}]
    x, y, st = report._joined(rows, report.REGIME_X, report.REGIME_Y)
    assert st.tolist() == [0, 2] and x.tolist() == [0.2, 0.5] and y.tolist() == [1.4, 0.4]


def test_regime_map_for_one_run_and_for_the_classroom_runs(tmp_path):
    needs_classroom()
    runs = report.load_runs([str(d) for d in CLASSROOM])
    one = report.plot_regime_map(runs[:1], tmp_path / "one.png", points=POINTS)
    many = report.plot_regime_map(runs, tmp_path / "many.png", points=POINTS, arm_by=["name"])
    bare = report.plot_regime_map([], tmp_path / "points.png", points=POINTS)       # calibration points only
    assert all(p.exists() and p.stat().st_size > 5000 for p in (one, many, bare))
    import matplotlib.image
    h1, w1 = matplotlib.image.imread(one).shape[:2]
    h9, w9 = matplotlib.image.imread(many).shape[:2]
    assert h9 == 3 * h1 and w9 == 3 * 400 and w1 == 560          # 3 arms (rows) x 3 seeds side by side (4 in + 1.6 in alone)


def test_plot_run_adds_the_regime_map_for_a_run_with_the_mi_proxy(tmp_path):
    needs_classroom()
    run = tmp_path / CLASSROOM[0].name
    run.mkdir()
    for f in ("config.json", "metrics.jsonl"):
        shutil.copy(CLASSROOM[0] / f, run / f)
    paths = report.plot_run(run, calibration=POINTS)
    assert run / "plots" / "regime_map.png" in paths and (run / "plots" / "regime_map.png").stat().st_size > 5000
    assert paths[0].name == "overview.png"


def test_page_shows_the_regime_map_with_a_calibration_file(tmp_path):
    needs_classroom()
    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps({"regime_points": {"frozen": [list(p) for p in POINTS]}}))
    runs = report.load_runs([str(d) for d in CLASSROOM[:2]])
    page = report.write_page(tmp_path / "page.md", runs, ["name"], [], [], [], calibration=str(cal))
    text = page.read_text()
    assert "## Regime map" in text and "![regime map](page_regime.png)" in text and "MI = 0.140" in text
    assert (tmp_path / "page_regime.png").exists()
    plain = report.write_page(tmp_path / "plain.md", runs, ["name"], [], [], []).read_text()
    assert "Regime map" not in plain and not (tmp_path / "plain_regime.png").exists()
