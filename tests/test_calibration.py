"""experiments/calibration.py: the prompts are the rollout's, the batches have the structure that makes their
I(X;Z) known, and the orderings that structure guarantees hold for the real scorer (tiny model, fp32).

Guaranteed for any scorer, checked here: template and fixed give MI-Est <= 0, MI-Seq-Est <= 0 and retrieval
exactly 1/N, the fixed batch's null is a constant equal to its observed value, the template batch's observed MI is
the null's expectation; a mixture's MI-Est is exactly (1 - α) x its own part + α x its template part, hence at
most (1 - α) x its own part. Not guaranteed and not asserted on the tiny model: healthy > template (the random
tiny model's samples hardly depend on the prompt, MI-Est ~ 1e-4 nats/token, either sign possible) and the order
of the mixtures in α. The committed SmolLM2 numbers are checked against their page (test_committed_table...)."""
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import calibration as cal  # noqa: E402

N, K = 4, 4


@pytest.fixture(scope="module")
def tiny():
    import policy
    model, tok = policy.load("tiny", seed=0)
    model.eval()
    return model, tok


@pytest.fixture(scope="module")
def scored(tiny):
    model, tok = tiny
    t = cal.build_texts(model, tok, n_prompts=N, k=K, max_new_tokens=8, seed=0)
    return t, cal.score_batches(model, t, n_perm=100, seed=0)


def test_prompt_is_the_rollouts_first_context(tiny):
    """bandit_prompt renders exactly the x_ids rollout.rollout conditions the first turn on."""
    import rollout
    model, tok = tiny
    seen = []

    def scripted(model, tokenizer, contexts, **kw):
        seen.extend(list(c) for c in contexts)                           # rollout extends them in place
        return [(tok.encode("<think>a</think><answer>x</answer>", add_special_tokens=False), [0.0] * 9)
                for _ in contexts]
    cfg = rollout.RolloutConfig(env="bandit", env_options={"payout": "deterministic"}, max_new_tokens=8,
                                prompt_budgets="env")             # the classroom runs' prompt: the env's 100 words
    rollout.rollout(model, tok, cfg, [5], 1, generate_fn=scripted)
    assert seen[0] == cal.bandit_prompt(tok, 5)
    assert "Max response length: 100 words (tokens). extra words<|im_end|>" in tok.decode(cal.bandit_prompt(tok, 5, "extra words"))


def test_prompt_seeds_have_distinct_arm_pairs():
    import envs
    seeds, held, shots = cal.distinct_pair_seeds(8, cal.FLOOR_SHOTS)
    env = envs.make_env("bandit", payout="deterministic")
    pairs = []
    for s in seeds + [held] + shots:
        env.reset(s)
        pairs.append(frozenset(env.action_names))
    assert len(shots) == 3 and len(set(pairs)) == 12                 # no demonstration shows a prompt's own arms
    assert cal.distinct_pair_seeds(8)[:2] == (seeds, held)
    with pytest.raises(ValueError, match="at most 8 with 3 shots"):
        cal.distinct_pair_seeds(9, 3)
    with pytest.raises(ValueError, match="at most 11"):
        cal.distinct_pair_seeds(12)


def test_floor_prompt_demonstrates_the_template_before_the_true_prompt(tiny):
    """The floor's context = the shots' exchanges (template reasoning, first-listed arm) then the true prompt's
    user turn, ending exactly like the prompt it is scored under."""
    import envs
    _, tok = tiny
    seeds, _, shots = cal.distinct_pair_seeds(4, cal.FLOOR_SHOTS)
    plain, templated = cal.bandit_prompt(tok, seeds[0]), cal.bandit_prompt(tok, seeds[0], shots=tuple(shots))
    text, env = tok.decode(templated), envs.make_env("bandit", payout="deterministic")
    assert text.count(f"<think>{cal.TEMPLATE_SENTENCE}</think>") == 3
    for s in shots:
        env.reset(s)
        assert f"<answer>{env.action_names[0]}</answer>" in text
    user = tok.decode(plain).split("<|im_start|>user")[-1]
    assert text.endswith(user) and len(templated) > len(plain) + 50


def test_batch_layout_makes_template_independent_of_the_prompt():
    b = cal.batches(N, K)
    pool0 = N * K
    rows, cols = b["template"]
    pairs = sorted(zip(rows, cols))
    assert pairs == sorted((pool0 + t, j) for t in range(K) for j in range(N))    # each text under each column once
    assert b["fixed"] == ([N * K + K] * N, list(range(N)))
    rows, cols = b["mix0.25"]                                                     # per prompt 3 own + 1 template
    assert [c for r, c in zip(rows, cols) if r >= pool0] == list(range(N)) and len(rows) == N * K
    assert all(r // K == c for r, c in zip(rows, cols) if r < pool0)              # own rows keep their prompt
    assert all(len(r) == len(c) == N * K for r, c in (b["healthy"], b["floor"]))
    with pytest.raises(ValueError, match="alpha"):
        cal.batches(N, 2, alphas=(0.1,))


def test_guaranteed_orderings_on_the_tiny_model(scored, tiny):
    t, res = scored
    assert len(t["prompts"]) == N and len(t["own"]) == len(t["floor"]) == N * K and len(t["pool"]) == K
    for name in ("template", "fixed"):
        m = res[name]
        assert m["mi_estimate"] <= 1e-12 and m["mi_seq_estimate"] <= 1e-12          # Jensen
        assert m["retrieval_accuracy"] == pytest.approx(1 / N, abs=1e-12)           # one hit per text
    assert res["fixed"]["mi_estimate_null_std"] == pytest.approx(0, abs=1e-12)      # constant null ...
    assert res["fixed"]["mi_estimate_null_mean"] == pytest.approx(res["fixed"]["mi_estimate"], abs=1e-12)
    tpl = res["template"]                                                           # ... and its expectation
    assert abs(tpl["mi_estimate"] - tpl["mi_estimate_null_mean"]) <= 5 * tpl["mi_estimate_null_std"] / 10 + 1e-12
    assert res["fixed"]["distinct_texts"] == 1 and res["template"]["distinct_texts"] == len({tuple(z) for z in t["pool"]})
    for a in cal.ALPHAS:
        m = res[f"mix{a}"]
        assert m["mi_estimate"] == pytest.approx((1 - a) * m["own_part_mi_estimate"] + a * m["template_part_mi_estimate"],
                                                 abs=1e-12)
        assert m["template_part_mi_estimate"] <= 1e-12
        assert m["mi_estimate"] <= (1 - a) * m["own_part_mi_estimate"] + 1e-12  # the mixing lemma on the estimator
    f = cal.score_batches(tiny[0], {**t, "floor_exact": [i % 3 == 0 for i in range(N * K)]}, n_perm=5)["floor"]
    n_ex = f["exact_rows"]                                         # the floor split: copies vs the rest, exactly
    assert sum(f["exact_per_prompt"]) == n_ex and len(f["exact_per_prompt"]) == N
    assert all(math.isfinite(f[f"{part}_part_null_mean"]) for part in ("exact", "rest"))
    assert n_ex == len(range(0, N * K, 3)) and f["rest_rows"] == N * K - n_ex
    assert f["mi_estimate"] == pytest.approx((n_ex * f["exact_part_mi_estimate"] + f["rest_rows"] *
                                              f["rest_part_mi_estimate"]) / (N * K), abs=1e-12)
    for m in res.values():
        assert m["conditional_entropy_est"] > 0 and math.isfinite(m["mi_estimate_null_z"] if m["mi_estimate_null_std"]
                                                                   > 0 else 0.0)


def test_outputs_table_and_regime_points(scored, tmp_path):
    t, res = scored
    result = {"scores": {"frozen": [res, res]}, "floor_compliance": [{"contains": 0.0, "exact": 0.0}] * 2}
    paths = cal.write_outputs(result, tmp_path / "c.json")
    assert all(p.exists() for p in paths) and paths[2].stat().st_size > 1000
    back = json.loads(paths[0].read_text())
    assert [p[0] for p in back["regime_points"]["frozen"]] == list(res)
    assert back["regime_points"]["frozen"][0][1] == pytest.approx(res["healthy"]["mi_estimate"])
    text = cal.table(result)
    assert text.count("\n") == 1 + len(res) and "| frozen | template | 0 (exact) |" in text
    assert " ± 0.000 " in text                                                   # two equal seeds: std 0 shown
    page = tmp_path / "c.md"                                   # a hand-written page: only its table is replaced
    page.write_text(f"intro\n{cal.TABLE_START}\nold numbers\n{cal.TABLE_END}\nreading\n")
    assert page in cal.write_outputs(result, tmp_path / "c.json")
    assert page.read_text() == f"intro\n{cal.TABLE_START}\n{text}\n{cal.TABLE_END}\nreading\n"


def test_committed_table_regenerates_from_the_committed_json():
    """The table on experiments/calibration.md is what --table-only prints from experiments/calibration.json."""
    js, page = ROOT / "experiments" / "calibration.json", ROOT / "experiments" / "calibration.md"
    if not js.exists() or not page.exists():
        pytest.skip("no committed calibration outputs")
    assert cal.table(json.loads(js.read_text())) in page.read_text()


def test_paper_driver_has_the_calibration_command(capsys):
    import paper
    paper.main(["list"])
    assert "calibration" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        paper.main(["calibration", "--prompts", "1"])                        # refused before any model loads


def test_committed_smollm2_numbers_keep_the_guaranteed_orderings():
    """The committed SmolLM2 run satisfies what the construction guarantees (the measured orderings are on the
    page, not asserted: healthy above its null, mixtures between)."""
    js = ROOT / "experiments" / "calibration.json"
    if not js.exists():
        pytest.skip("no committed calibration outputs")
    result = json.loads(js.read_text())
    for per_seed in result["scores"].values():
        for res in per_seed:
            N = res["healthy"]["n_cols"]
            for name in ("template", "fixed"):
                assert res[name]["mi_estimate"] <= 1e-12 and res[name]["mi_seq_estimate"] <= 1e-12
                assert res[name]["retrieval_accuracy"] == pytest.approx(1 / N, abs=1e-12)
            assert res["fixed"]["mi_estimate_null_std"] == pytest.approx(0, abs=1e-12)
            for a in cal.ALPHAS:
                m = res[f"mix{a}"]
                assert m["mi_estimate"] == pytest.approx((1 - a) * m["own_part_mi_estimate"]
                                                         + a * m["template_part_mi_estimate"], abs=1e-9)
            f = res["floor"]                                          # the floor's split: copies + the rest
            assert f["exact_rows"] + f["rest_rows"] == f["n_rows"] == sum(f["exact_per_prompt"]) + f["rest_rows"]
            assert f["exact_part_mi_estimate"] == pytest.approx(f["exact_part_null_mean"], abs=1e-6)  # one text:
            #                                   every shuffle of its labels scores the same, however uneven the spread
            assert f["mi_estimate"] == pytest.approx((f["exact_rows"] * f["exact_part_mi_estimate"] + f["rest_rows"]
                                                      * f["rest_part_mi_estimate"]) / f["n_rows"], abs=1e-9)
    assert result["precision"] == "fp32" and result["seeds"] == [0, 1, 2]
    assert all(c["exact"] > 0.5 for c in result["floor_compliance"])  # the floor batch really is templated
