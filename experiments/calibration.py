"""The MI proxy calibrated on batches whose input dependence is known by construction (issue 23, item 1).

The paper (RAGEN-2 §2.3, eq. 2: H(Z) = H(Z|X) + I(X;Z); App. F: the in-batch cross-scoring estimators) reads
template collapse off MI-Est and entropy off Ĥ(Z|X). This file asks what those numbers are on batches for which
we *know* the answer, built from SmolLM2's own tokens on the real first-turn Bandit prompts (the env and prompt
format of the classroom runs, experiments/RESULTS.md) and scored by the real code (mi_proxy.cross_log_probs,
mi_metrics.collapse_metrics and permutation_null), in fp32, by the frozen initial model (and by a trained policy
when `--policy RUN_DIR` names a run with a checkpoint):

    healthy    each prompt's own sampled reasonings (T = 1): I(X;Z) > 0 in the sampler (KL(q_j || mixture) >= 0)
    mix α      per prompt (1 − α)K own reasonings + αK template texts, the template texts the same for every
               prompt: the template-mixing lemma (App. I/J, I_α <= (1 − α) I) on the estimator itself
    template   K texts sampled from one held-out prompt x0 (another arm pair), every text given to every prompt:
               diverse within a prompt, and the batch's empirical I(X;Z) is exactly 0 (its joint is p(x) p(z))
    fixed      one text, the greedy continuation of x0, for every prompt: low-entropy collapse (H(Z|X) = 0)
    floor      the referee's teacher-forcing floor: reasonings sampled *after the true prompt*, templated by
               3 earlier turns in the same chat (other arm pairs) in which the assistant wrote one generic sentence
               whatever the arms were (SmolLM2-135M copies an in-context pattern: 86-92 % of the committed floor
               samples contain the sentence, against 3 % for a written instruction); scored against the prompts
               without those turns
               (the input a collapsed policy actually sees), so whatever stands above the null is carry-over from x

What the construction guarantees for ANY scorer (tests/test_calibration.py checks each on the tiny model):
  * template, fixed: MI-Est <= 0 and MI-Seq-Est <= 0 (Jensen: every text sits under every column once, and the
    marginal is the log of the mean), retrieval accuracy = 1/N exactly, and the observed MI equals the mean of the
    label-shuffling null in expectation (fixed: the null is a constant);
  * mix α: MI-Est(mix α) = (1 − α) MI-Est(own part) + α MI-Est(template part) exactly (the estimator averages
    per-row gaps and a row's marginal does not depend on the other rows), hence <= (1 − α) MI-Est(own part).
Not guaranteed (measured): healthy > 0 (only in expectation, per sequence, when sampler = scorer at T = 1 and Z
is the whole sample; our Z stops at </think>), the order of the mixtures in α, and where fixed sits on the
Ĥ(Z|X) axis: Ĥ(Z|X) = −mean log q(z_i | x_i) is a cross-entropy to the *scorer*, not the batch's own diversity,
so a fixed text is low only if the scorer finds it likely (hence the greedy text).

Left out: other envs (multi-turn contexts are Turn.x_ids of later turns; the first-turn Bandit prompt is what
the classroom runs score), the trajectory-uniform family, bf16 scoring.
Run (230-250 s per seed on one thread of a 2-core AMD EPYC beside a training job; writes experiments/calibration.json,
calibration.csv and calibration.png, then the table of experiments/calibration.md):
    python experiments/paper.py calibration                     # = python experiments/calibration.py (seeds 0 1 2)
    python experiments/calibration.py --seeds 0 1 2 --policy runs/<run with checkpoints> --out runs/cal/calibration.json
    python experiments/calibration.py --table-only              # rebuild the table and figure from the JSON
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mi_metrics as mm  # noqa: E402
import mi_proxy as mp  # noqa: E402

ALPHAS = (0.25, 0.5, 0.75)
TEMPLATE_SENTENCE = "I will pick one of the two arms."
FLOOR_SHOTS = 3          # earlier turns that demonstrate the template (a one-off probe, 32 samples each:
#                          1 shot 31 % compliance, 2: 78 %, 3: 84 %; experiments/calibration.md)
PAIRS = 12               # distinct arm pairs in the Bandit's train split: N prompts + x0 + the shots must fit
# I(X;Z) of each batch by construction, as printed in the table
TRUTH = {"healthy": "> 0 (sampled)", "template": "0 (exact)", "fixed": "0, H(Z\\|X) = 0",
         "floor": "≈ 0 intended (3-shot template)", **{f"mix{a}": f"≤ {1 - a:g}·I" for a in ALPHAS}}
TABLE_START, TABLE_END = "<!-- calibration table: written by experiments/calibration.py -->", "<!-- end of table -->"
KEYS = ("mi_estimate", "mi_seq_estimate", "retrieval_accuracy", "retrieval_chance_level", "conditional_entropy_est",
        "conditional_entropy_seq_est", "mi_upper_bound", "n_rows", "n_cols", "mi_estimate_null_mean",
        "mi_estimate_null_std", "mi_estimate_null_z", "mi_estimate_null_p", "mi_seq_estimate_null_mean",
        "mi_seq_estimate_null_z", "retrieval_accuracy_null_p")


# ----------------------------------------------------------------------------------------------------------
# Prompts: the first-turn Bandit prompt exactly as rollout.rollout builds it
# ----------------------------------------------------------------------------------------------------------
def bandit_prompt(tok, seed: int, extra: str = "", shots: tuple = ()) -> list:
    """Token ids of the first-turn context of a deterministic-payout Bandit instance (system + user + assistant
    header + the forced <think>), as rollout.rollout renders it with prompt_budgets="env" (the classroom runs'
    prompt: the env's own 100-word hint); `extra` is appended to the user message; `shots` (env seeds) puts one
    earlier exchange per seed before it, in which the assistant answers
    `<think>TEMPLATE_SENTENCE</think><answer>first-listed arm</answer>` (the floor's in-context template)."""
    import envs
    import rollout
    env = envs.make_env("bandit", payout="deterministic")
    user = lambda obs: rollout.turn_block(1, obs, env.max_actions, env.max_tokens, True)   # noqa: E731
    messages = [{"role": "system", "content": "You're a helpful assistant. " + env.instructions}]
    for s in shots:
        messages += [{"role": "user", "content": user(env.reset(s))},
                     {"role": "assistant", "content": f"<think>{TEMPLATE_SENTENCE}</think>"
                                                      f"<answer>{env.action_names[0]}</answer>"}]
    obs = env.reset(seed)
    messages.append({"role": "user", "content": user(obs) + (" " + extra if extra else "")})
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"
    return tok.encode(text, add_special_tokens=False)


def distinct_pair_seeds(n: int, shots: int = 0) -> tuple[list, int, list]:
    """The first n env seeds whose arm pairs (as sets) all differ, one more seed with yet another pair (the
    held-out prompt x0 of the template batches), and `shots` more with further pairs (the floor's demonstrations),
    so no demonstration shows a prompt's own arms. Bandit's train split has 12 pairs: n + 1 + shots <= 12."""
    import envs
    if n + 1 + shots > PAIRS:
        raise ValueError(f"n must be at most {PAIRS - 1 - shots} with {shots} shots (Bandit's train split has "
                         f"{PAIRS} arm pairs), got {n}")
    env, seen, seeds = envs.make_env("bandit", payout="deterministic"), set(), []
    for s in range(10_000):
        env.reset(s)
        pair = frozenset(env.action_names)
        if pair not in seen:
            seen.add(pair)
            seeds.append(s)
        if len(seeds) == n + 1 + shots:
            return seeds[:n], seeds[n], seeds[n + 1:]
    raise RuntimeError("fewer distinct arm pairs than PAIRS in 10000 seeds")


# ----------------------------------------------------------------------------------------------------------
# Reasonings: SmolLM2's own samples, Z = the tokens before </think> (the whole sample if it never closes)
# ----------------------------------------------------------------------------------------------------------
def reasonings(model, tok, contexts: list, *, temperature: float, max_new_tokens: int, seed: int) -> list:
    """One reasoning per context, sampled by sampling.generate in fp32 and seeded.  Z = rollout.reasoning_ids
    (ids before the first </think>) when the model closes the tag, else every sampled id except end-of-turn
    tokens (at step 0 SmolLM2 closes it in about a third of its turns); never empty (a reasoning that is empty
    after the cut keeps its sampled ids)."""
    import rollout
    import sampling
    torch.manual_seed(seed)
    outs = sampling.generate(model, tok, contexts, max_new_tokens=max_new_tokens, temperature=temperature,
                             stop=("</think>",), bf16=False, kv=sampling.KVStore(),     # equal prompts encoded once
                             keys=list(range(len(contexts))))
    eos = sampling.eos_ids(model, tok)
    z_all = []
    for gen, _ in outs:
        text = tok.decode(gen, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        z = rollout.reasoning_ids(tok, gen, text, "sampled") if "</think>" in text else [t for t in gen
                                                                                         if t not in eos]
        z_all.append(list(z) or list(gen))
    return z_all


def build_texts(model, tok, *, n_prompts: int = 8, k: int = 8, max_new_tokens: int = 48, seed: int = 0) -> dict:
    """Everything sampled for one calibration seed: prompts (N), own reasonings (N x K, prompt-major), the
    template pool (K texts from the held-out prompt), the greedy fixed text, and the templated floor reasonings
    (N x K).  Torch sampling seeds 10·seed (own), 10·seed + 1 (pool), 10·seed + 2 (floor): no stream reused."""
    seeds, held_out, shots = distinct_pair_seeds(n_prompts, FLOOR_SHOTS)
    prompts = [bandit_prompt(tok, s) for s in seeds]
    x0 = bandit_prompt(tok, held_out)
    templated = [bandit_prompt(tok, s, shots=tuple(shots)) for s in seeds]      # the floor's contexts
    rep = lambda xs: [x for x in xs for _ in range(k)]                     # noqa: E731  prompt-major, K each
    gen = dict(temperature=1.0, max_new_tokens=max_new_tokens)
    own = reasonings(model, tok, rep(prompts), seed=10 * seed, **gen)
    pool = reasonings(model, tok, [x0] * k, seed=10 * seed + 1, **gen)
    fixed = reasonings(model, tok, [x0], temperature=0.0, max_new_tokens=max_new_tokens, seed=0)[0]   # greedy
    floor = reasonings(model, tok, rep(templated), seed=10 * seed + 2, **gen)
    exact = [tok.decode(z).strip() == TEMPLATE_SENTENCE for z in floor]   # rows that are the template itself
    return {"env_seeds": seeds, "held_out_seed": held_out, "shot_seeds": shots, "prompts": prompts, "own": own, "pool": pool,
            "fixed": fixed, "floor": floor, "floor_exact": exact, "k": k}


# ----------------------------------------------------------------------------------------------------------
# Batches: rows of one shared cross-score matrix, with their labels
# ----------------------------------------------------------------------------------------------------------
def batches(n_prompts: int, k: int, alphas=ALPHAS) -> dict:
    """name -> (row ids into the unique-text list, true column of each row), for texts laid out as
    own[N*K] | pool[K] | fixed[1] | floor[N*K].  Template texts go to every prompt (each text under every column
    once), which is what makes the empirical I(X;Z) exactly 0."""
    N, K = n_prompts, k
    own = lambda j, i: j * K + i                                   # noqa: E731
    pool0, fixed0, floor0 = N * K, N * K + K, N * K + K + 1
    out = {"healthy": ([own(j, i) for j in range(N) for i in range(K)], [j for j in range(N) for _ in range(K)])}
    for a in alphas:
        m = round(a * K)                                           # template texts per prompt
        if not 0 < m < K:
            raise ValueError(f"alpha {a} x K={K} must leave between 1 and K-1 template rows per prompt")
        rows = [own(j, i) for j in range(N) for i in range(K - m)] + [pool0 + t for j in range(N) for t in range(m)]
        cols = [j for j in range(N) for _ in range(K - m)] + [j for j in range(N) for _ in range(m)]
        out[f"mix{a}"] = (rows, cols)
    out["template"] = ([pool0 + t for j in range(N) for t in range(K)], [j for j in range(N) for _ in range(K)])
    out["fixed"] = ([fixed0] * N, list(range(N)))
    out["floor"] = ([floor0 + j * K + i for j in range(N) for i in range(K)], [j for j in range(N) for _ in range(K)])
    return out


def texts_in_order(t: dict) -> list:
    """The unique reasonings in the layout `batches` indexes: own | pool | fixed | floor."""
    return [*t["own"], *t["pool"], t["fixed"], *t["floor"]]


def score_batches(model, t: dict, *, n_perm: int = 200, seed: int = 0, alphas=ALPHAS) -> dict:
    """Cross-score every unique text under every prompt once (fp32), then the metrics and the permutation null
    of each batch on its rows.  name -> {KEYS..., plus for mixtures the exact decomposition's parts}."""
    import policy
    texts = texts_in_order(t)
    with policy.autocast("cpu", enabled=False):
        L_tok, L_seq = mp.cross_log_probs(model, t["prompts"], texts)               # (M_unique, N), fp64
    lengths = np.array([len(z) for z in texts])
    N, K, out = len(t["prompts"]), t["k"], {}
    for name, (rows, cols) in batches(N, K, alphas).items():
        r = np.asarray(rows)
        args = (L_tok[r], L_seq[r], cols)
        m = mm.collapse_metrics(*args, lengths=lengths[r])
        m.update(mm.permutation_null(*args, None, n_perm, np.random.default_rng(seed), lengths=lengths[r]))
        out[name] = {k: m[k] for k in KEYS}
        out[name]["mean_tokens"] = float(lengths[r].mean())
        out[name]["distinct_texts"] = len({tuple(texts[i]) for i in rows})
        if name.startswith("mix"):                                  # the two parts of the exact decomposition
            m_tpl = round(float(name[3:]) * K)
            own_part = mm.collapse_metrics(L_tok[r[:N * (K - m_tpl)]], L_seq[r[:N * (K - m_tpl)]],
                                           cols[:N * (K - m_tpl)], lengths=lengths[r[:N * (K - m_tpl)]])
            tpl_part = mm.collapse_metrics(L_tok[r[N * (K - m_tpl):]], L_seq[r[N * (K - m_tpl):]],
                                           cols[N * (K - m_tpl):], lengths=lengths[r[N * (K - m_tpl):]])
            out[name]["own_part_mi_estimate"] = own_part["mi_estimate"]
            out[name]["template_part_mi_estimate"] = tpl_part["mi_estimate"]
        if name == "floor" and "floor_exact" in t:        # the same identity splits the floor: copies vs the rest,
            ex = np.asarray(t["floor_exact"], bool)      # each part beside its own permutation null (its rows only)
            out[name]["exact_per_prompt"] = [int(ex[j * K:(j + 1) * K].sum()) for j in range(N)]
            for part, sel in (("exact", ex), ("rest", ~ex)):
                out[name][f"{part}_rows"] = int(sel.sum())
                if not sel.any():
                    out[name][f"{part}_part_mi_estimate"] = out[name][f"{part}_part_null_mean"] = math.nan
                    continue
                pargs = (L_tok[r[sel]], L_seq[r[sel]], [int(c) for c in np.asarray(cols)[sel]])
                out[name][f"{part}_part_mi_estimate"] = mm.collapse_metrics(*pargs, lengths=lengths[r[sel]])[
                    "mi_estimate"]
                out[name][f"{part}_part_null_mean"] = mm.permutation_null(
                    *pargs, None, n_perm, np.random.default_rng(seed), lengths=lengths[r[sel]])["mi_estimate_null_mean"]
    return out


def compliance(tok, floor: list) -> dict:
    """How templated the floor really is: the fraction of its reasonings that contain the template sentence, and
    the fraction that are exactly it (one text, but spread unevenly over the prompts, so unlike the fixed batch
    their MI-Est is not their null's: `score_batches` reports each part beside its own null)."""
    texts = [tok.decode(z).strip() for z in floor]
    return {"contains": float(np.mean([TEMPLATE_SENTENCE.lower() in t.lower() for t in texts])),
            "exact": float(np.mean([t == TEMPLATE_SENTENCE for t in texts]))}


# ----------------------------------------------------------------------------------------------------------
# Outputs: JSON (the authority), CSV, the table, the figure
# ----------------------------------------------------------------------------------------------------------
def summary_rows(result: dict) -> list:
    """One row per (scorer, batch): mean and sample std over seeds of the headline numbers."""
    rows = []
    for scorer, per_seed in result["scores"].items():
        for name in per_seed[0]:
            row = {"scorer": scorer, "batch": name, "truth": TRUTH.get(name, ""), "n_seeds": len(per_seed)}
            for key in ("mi_estimate", "mi_estimate_null_mean", "mi_estimate_null_z", "mi_estimate_null_p",
                        "mi_seq_estimate", "retrieval_accuracy", "retrieval_chance_level", "conditional_entropy_est"):
                v = np.array([s[name][key] for s in per_seed], float)
                row[key] = float(np.nanmean(v)) if np.isfinite(v).any() else math.nan
                row[key + "_std"] = float(np.nanstd(v, ddof=1)) if np.isfinite(v).sum() > 1 else math.nan
                row[key + "_max"] = float(np.nanmax(v)) if np.isfinite(v).any() else math.nan
            rows.append(row)
    return rows


def _fmt(v, s, nd=3):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.{nd}f}" + (f" ± {s:.{nd}f}" if s is not None and not math.isnan(s) else "")


def table(result: dict) -> str:
    """The Markdown table of the results page (mean ± std over seeds when there are several)."""
    head = ("| scorer | batch | I(X;Z) by construction | MI-Est (nats/token) | its null mean | null z | null p (largest) | "
            "MI-Seq-Est (nats) | retrieval acc. (chance) | Ĥ(Z\\|X) (nats/token) |\n|" + "---|" * 10)
    lines = [head]
    for r in summary_rows(result):
        lines.append(f"| {r['scorer']} | {r['batch']} | {r['truth']} | {_fmt(r['mi_estimate'], r['mi_estimate_std'])}"
                     f" | {_fmt(r['mi_estimate_null_mean'], r['mi_estimate_null_mean_std'])}"
                     f" | {_fmt(r['mi_estimate_null_z'], r['mi_estimate_null_z_std'], 1)}"
                     f" | {_fmt(r['mi_estimate_null_p_max'], None)}"
                     f" | {_fmt(r['mi_seq_estimate'], r['mi_seq_estimate_std'])}"
                     f" | {_fmt(r['retrieval_accuracy'], r['retrieval_accuracy_std'])} "
                     f"({r['retrieval_chance_level']:.3f}) | "
                     f"{_fmt(r['conditional_entropy_est'], r['conditional_entropy_est_std'])} |")
    return "\n".join(lines)


def regime_points(result: dict, scorer: str = "frozen") -> list:
    """(label, MI-Est, Ĥ(Z|X)) per batch, mean over seeds: the calibration points of report.plot_regime_map."""
    return [(r["batch"], r["mi_estimate"], r["conditional_entropy_est"]) for r in summary_rows(result)
            if r["scorer"] == scorer]


def write_outputs(result: dict, out: Path) -> list:
    """calibration.json (everything), calibration.csv (the summary), calibration.png (the batches on the regime
    map, report.plot_regime_map) and, if calibration.md exists with the table markers, its table; returns the
    paths written."""
    import report
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".json"), out.with_suffix(".csv"), out.with_suffix(".png")]
    result["regime_points"] = {s: regime_points(result, s) for s in result["scores"]}    # read by report.py
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    rows = summary_rows(result)
    with paths[1].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    points = result["regime_points"]["frozen"] + [(f"policy: {n}", x, y) for n, x, y in
                                                  result["regime_points"].get("policy", [])]
    report.plot_regime_map([], paths[2], points=points,
                           title="MI proxy on batches of known input dependence (frozen SmolLM2, fp32)")
    page = out.with_suffix(".md")                  # the hand-written page: its table is replaced between markers
    text = page.read_text() if page.exists() else ""
    if TABLE_START in text and TABLE_END in text:
        head, rest = text.split(TABLE_START, 1)
        page.write_text(f"{head}{TABLE_START}\n{table(result)}\n{TABLE_END}{rest.split(TABLE_END, 1)[1]}")
        paths.append(page)
    return paths


def run(args) -> dict:
    import policy
    model, tok = policy.load(args.model)
    model.eval()
    scorers = {"frozen": model}
    if args.policy:                                   # a trained policy: the last checkpoint of a run directory
        import copy

        import runlog
        ckpt = runlog.load_checkpoint(args.policy)
        if ckpt is None:
            raise SystemExit(f"--policy {args.policy}: no checkpoints/last/rank0.pt there")
        trained = copy.deepcopy(model)
        policy.load_checkpoint_state(trained, ckpt["model"], bool(ckpt.get("lora")))
        scorers["policy"] = trained.eval()
    result = {"model": args.model, "policy": args.policy or None, "n_prompts": args.prompts, "k": args.k,
              "max_new_tokens": args.max_new_tokens, "n_perm": args.n_perm, "seeds": args.seeds,
              "precision": "fp32", "torch": torch.__version__, "threads": torch.get_num_threads(),
              "scores": {s: [] for s in scorers}, "floor_compliance": [], "texts": [], "seconds": []}
    for seed in args.seeds:
        t0 = time.perf_counter()
        t = build_texts(model, tok, n_prompts=args.prompts, k=args.k, max_new_tokens=args.max_new_tokens, seed=seed)
        for name, scorer in scorers.items():
            result["scores"][name].append(score_batches(scorer, t, n_perm=args.n_perm, seed=seed))
        result["floor_compliance"].append(compliance(tok, t["floor"]))
        result["texts"].append({"seed": seed, "env_seeds": t["env_seeds"], "held_out_seed": t["held_out_seed"],
                                "shot_seeds": t["shot_seeds"],
                                "own_first": [tok.decode(z) for z in t["own"][::args.k]],
                                "pool": [tok.decode(z) for z in t["pool"]], "fixed": tok.decode(t["fixed"]),
                                "floor_first": [tok.decode(z) for z in t["floor"][::args.k]]})
        result["seconds"].append(time.perf_counter() - t0)
        print(f"seed {seed}: {result['seconds'][-1]:.0f} s", flush=True)
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--policy", default="", help="a run directory with checkpoints: also score with its policy")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                    help="calibration seeds (the committed run: 0 1 2)")
    ap.add_argument("--prompts", type=int, default=8, help="N prompts (distinct Bandit arm pairs, at most 8: "
                    "12 pairs minus x0 and the floor's 3 demonstrations)")
    ap.add_argument("--k", type=int, default=8, help="reasonings per prompt (K; alpha x K must be an integer)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--n-perm", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "calibration.json"))
    ap.add_argument("--table-only", action="store_true", help="rebuild csv/png/table from the JSON, no model")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.table_only:
        result = json.loads(out.read_text())
    else:
        if not 2 <= args.prompts <= PAIRS - 1 - FLOOR_SHOTS:
            raise SystemExit(f"--prompts must be in 2..{PAIRS - 1 - FLOOR_SHOTS} (distinct Bandit arm pairs beside x0 "
                             f"and the floor's {FLOOR_SHOTS} demonstrations), got {args.prompts}")
        result = run(args)
    for p in write_outputs(result, out):
        print(f"wrote {p}")
    print(table(result))
    print("floor compliance (template sentence contained / exact):", result["floor_compliance"])


if __name__ == "__main__":
    main()
