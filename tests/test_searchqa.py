"""searchqa.py: BM25 by hand, the official reward rules, the result block, solvability, honesty, invalid actions,
seeding, options, and a train.py smoke run on SearchQA-mini."""
import copy
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import envs
import rollout
import runlog
from agentic import searchqa
import train
from rollout import RolloutConfig
from agentic.searchqa import BM25, SearchQA, answer_reward, f1_score, format_results, normalize_answer

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------- BM25
def test_bm25_scores_match_a_hand_computation():
    docs = ["The cat and the dog", "dog dog bird", "fish"]        # tokens: [cat, dog], [dog, dog, bird], [fish]
    index = BM25(docs, k1=0.9, b=0.4)
    avgdl = (2 + 3 + 1) / 3
    idf_dog = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))             # dog is in 2 of 3 documents
    idf_bird = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    norm = [0.9 * (1 - 0.4 + 0.4 * dl / avgdl) for dl in (2, 3, 1)]
    expected = [idf_dog * 1 * 1.9 / (1 + norm[0]),
                idf_dog * 2 * 1.9 / (2 + norm[1]) + idf_bird * 1 * 1.9 / (1 + norm[1]),
                0.0]
    assert index.scores("dog bird") == pytest.approx(expected)
    assert expected[0] == pytest.approx(math.log(1.6))            # tf 1 at the average length: idf exactly
    assert index.scores("the DOG, of bird!") == pytest.approx(expected)   # case, punctuation, stop words
    assert index.scores("dog dog") == pytest.approx([2 * expected[0], 2 * idf_dog * 3.8 / (2 + norm[1]), 0])
    assert index.scores("unicorn") == pytest.approx([0, 0, 0])
    hits = index.search("dog bird", k=5)                          # score-0 documents are never returned
    assert [i for i, _ in hits] == [1, 0] and hits[0][1] == pytest.approx(expected[1])


def test_result_block_has_official_layout_and_caps():
    contents = ['"A"\n' + "x" * 30, '"B"\nshort']
    out = format_results([(1, 2.5), (0, 1.25)], contents, max_doc_chars=10, max_total_chars=4000)
    assert out == ('[Document 1] (ID: doc_1, Score: 2.500)\n"B"\nshort\n\n'
                   '[Document 2] (ID: doc_2, Score: 1.250)\n"A"\nxxxxxx...')
    assert format_results([(1, 2.5), (0, 1.25)], contents, 800, 20) == out[:20] + "..."
    assert format_results([], contents) == "No relevant documents found for the query."


# -------------------------------------------------------------------------------------------------- reward
def test_answer_normalisation_exact_match_f1_and_threshold():
    assert normalize_answer("  The Aldra   River! ") == "aldra river"
    assert answer_reward("the aldra.", "Aldra") == (1.0, True, 1.0)         # EM after normalisation
    assert answer_reward("Aldra river", "Aldra") == pytest.approx((2 / 3, False, 2 / 3))   # P 1/2, R 1
    assert answer_reward("Nadia", "Nadia Pryce") == pytest.approx((2 / 3, False, 2 / 3))   # P 1, R 1/2
    long = "Nadia was the name I think of"                  # 'the' dropped: 1 of 6 tokens, F1 = 2 (1/6) / (7/6)
    assert f1_score(long, "Nadia") == pytest.approx(2 / 7)
    assert answer_reward(long, "Nadia") == (0.0, False, pytest.approx(2 / 7))              # below 0.3
    assert answer_reward(long, "Nadia", f1_threshold=0.2)[0] == pytest.approx(2 / 7)
    assert answer_reward("Varnholm", "Ostmere") == (0.0, False, 0.0)
    assert f1_score("yes", "yes indeed") == 0.0 and f1_score("no", "no") == 1.0            # yes/no/noanswer rule


def test_finish_grades_and_ends_the_episode():
    env = SearchQA()
    env.reset(0)
    gold = env.answer
    obs, reward, done, info = env.step(f"finish[the {gold}]")
    assert (obs, reward, done) == (f"Your answer: the {gold}. Reward: 1.00", 1.0, True)
    assert info["valid"] and info["success"] and info["exact_match"]
    assert env.step(f"finish[{gold}]")[1:3] == (0.0, True) and not env.step("search[x]")[3]["valid"]  # over
    env.reset(0)
    env.answer = "Port Kestrel"                                     # a hand-built gold answer
    obs, reward, done, info = env.step("finish[Kestrel]")           # F1 2/3 >= 0.3: partial credit, success
    assert (obs, done, info["success"], info["exact_match"]) == ("Your answer: Kestrel. Reward: 0.67", True, True,
                                                                 False)
    assert reward == pytest.approx(2 / 3)
    env.reset(0)
    env.answer = "Port Kestrel"
    _, reward, done, info = env.step("finish[Kestrel and more words here now]")    # F1 0.25 < 0.3
    assert (reward, done, info["success"]) == (0.0, True, False) and info["f1"] == pytest.approx(0.25)
    env.reset(0)
    _, reward, done, info = env.step("finish[Nobody Atall]")
    assert (reward, done, info["success"], info["f1"]) == (0.0, True, False, 0.0)


# ----------------------------------------------------------------------------------- solvability, honesty
SEEDS = list(range(123, 153)) + list(range(10000, 10030))          # validation and training seeds


def test_scripted_two_search_policy_solves_every_instance():
    env = SearchQA()
    for seed in SEEDS:
        ret, success, actions = searchqa.two_search_policy(env, seed)
        assert success and ret == 1.0, (seed, actions)
        assert [a.split("[")[0] for a in actions] == ["search", "search", "finish"]
        assert actions == env.solution                             # reading the pages recovers the known path


def test_gold_queries_retrieve_gold_passages_and_one_search_is_not_enough():
    env = SearchQA()
    one_search = []
    for seed in SEEDS:
        env.reset(seed)
        assert searchqa.gold_ranks(env) == [1, 1]                   # recall@1 of both gold passages
        hop1, hop2 = (env.world["passages"][g] for g in env.world["gold"])
        top = [i for i, _ in env.index.search(env.question, env.top_k)]
        assert env.world["gold"][1] not in top                     # the question alone misses hop 2
        work = env.world["queries"][0].removesuffix(" novel").removesuffix(" film")
        assert work not in hop2[1] and hop2[0] in hop1[1]          # hop 2 needs the bridge found in hop 1
        assert normalize_answer(env.answer) not in normalize_answer(env.question)
        one_search.append(searchqa.one_search_policy(env, seed)[1])
    assert sum(one_search) / len(one_search) <= 0.1                # searching the question text: chance level


def test_distractors_share_names_and_words_with_the_gold_chain():
    env = SearchQA()
    for seed in range(20):
        env.reset(seed)
        titles = [t for t, _ in env.world["passages"]]
        hop1, hop2 = (titles[g] for g in env.world["gold"])
        kind, attr = env.world["template"]
        if kind == "org":                                           # another organisation with the same first word
            assert sum(t.split()[0] == hop1.split()[0] for t in titles) >= 2
        else:                                                       # a novel and a film with the same title
            assert titles.count(hop1) == 2
        if attr != "river":                                         # people sharing a surname / a first name
            first, last = hop2.split()
            assert any(t != hop2 and t.endswith(" " + last) for t in titles)
            assert any(t != hop2 and t.startswith(first + " ") for t in titles)


def test_rollout_with_the_scripted_reader_solves_it():
    """The reader policy, fed the rollout's own observations (decoded context), solves episodes end to end."""
    import policy

    model, tok = policy.load("tiny")

    def reader(model, tokenizer, contexts, **kw):
        outs = []
        for ctx in contexts:
            text = tokenizer.decode(ctx)
            question = re.findall(r"Question: (.*)\n", text)[0]
            obs = text[text.rindex("State:\n") + len("State:\n"):text.rindex("\nYou have ")]
            action = searchqa.two_search_action(question, obs)
            ids = tokenizer.encode(f" read </think> <answer>{action}</answer>", add_special_tokens=False)
            outs.append((ids, [0.0] * len(ids)))
        return outs

    trajs = rollout.rollout(model, tok, RolloutConfig(env="searchqa"), [123, 10000], 2, generate_fn=reader)
    for tr in trajs:
        assert tr.success and tr.ret == 1.0 and tr.end_reason == "done" and len(tr.turns) == 3
        assert [a.split("[")[0] for t in tr.turns for a in t.actions] == ["search", "search", "finish"]


# ------------------------------------------------------------------------------------------ invalid actions
def test_invalid_and_unformatted_actions():
    env = SearchQA()
    obs = env.reset(5)
    for bad in ("", "   ", None, 42):                               # nothing to read: ignored, costs nothing
        assert env.step(bad)[:3] == (obs, 0.0, False) and env.num_actions == 0
    # official fallback: free text is read as the final answer and ends the episode, marked invalid
    out, reward, done, info = env.step(f"I think the answer is {env.answer}.")
    assert done and reward == 1.0 and not info["valid"] and info["action_type"] == "fallback"
    assert out == f"Your answer (extracted): {env.answer}. Reward: 1.00" and env.num_actions == 0
    assert searchqa.extract_answer(r"so it is \boxed{Ostmere} then") == "Ostmere"
    assert searchqa.extract_answer("<think>hmm</think> It is **Varnholm** surely") == "Varnholm"
    # fallback="invalid": free text changes nothing
    env = SearchQA(fallback="invalid")
    obs = env.reset(5)
    assert env.step("search for the founder")[:3] == (obs, 0.0, False)
    # keywords are case-insensitive; an empty query is a valid search that finds nothing
    out, _, done, info = env.step("SEARCH[]")
    assert info["valid"] and not done and "No relevant documents found for the query." in out
    assert out.endswith("\n\nAvailable actions: search[<query>], finish[<answer>]")


def test_max_steps_ends_the_episode_without_an_answer():
    env = SearchQA(max_steps=2)
    env.reset(1)
    assert not env.step(env.solution[0])[2]
    out, reward, done, info = env.step(env.solution[1])
    assert done and reward == 0.0 and not info["success"]
    assert out.endswith("\n\nMaximum search steps reached. Episode ended without an answer.")


# ----------------------------------------------------------------------------------------------- seeding
def test_same_seed_same_instance_in_any_order_and_any_process():
    a, b = SearchQA(), SearchQA()
    a.reset(9)
    first = a.reset(7)
    assert first == b.reset(7) and a.world == b.world and a.solution == b.solution
    clone = copy.deepcopy(a)
    assert a.step(a.solution[0]) == clone.step(a.solution[0])
    envs20 = [SearchQA() for _ in range(20)]
    questions = {e.reset(s) for s, e in enumerate(envs20)}
    assert len({repr(e.world) for e in envs20}) == 20 and len(questions) >= 15   # questions may recur, facts not
    # a fresh interpreter with another string-hash seed draws the same instance
    code = "from agentic import searchqa; e = searchqa.SearchQA(); e.reset(7); print(repr((e.question, e.world['passages'])))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert out.strip() == repr((a.question, a.world["passages"]))


def test_registered_with_official_budgets_and_instructions():
    env = envs.make_env("searchqa")
    assert "searchqa" in envs.ENV_NAMES
    assert (env.max_turns, env.max_actions_per_turn, env.max_actions, env.max_tokens) == (5, 1, 10, 300)
    assert (env.top_k, env.max_doc_chars, env.max_total_chars, env.max_steps) == (5, 800, 4000, 10)
    assert env.instructions.startswith("You are a search agent answering questions by searching for information.")
    assert "search[your query]" in env.instructions and "finish[your answer]" in env.instructions
    assert env.reset(0).endswith("\nAvailable actions: search[<query>], finish[<answer>]")
    obs = env.step(env.solution[0])[0]
    assert obs.startswith(f"Search results for '{env.world['queries'][0]}':\n[Document 1] (ID: doc_1, Score: ")
    assert len(re.findall(r"\[Document \d\]", obs)) == 5


@pytest.mark.parametrize("option,value", [("top_k", 0), ("max_doc_chars", -1), ("max_steps", 1.5),
                                          ("f1_threshold", 1.5), ("fallback", "grade"), ("num_works", 1),
                                          ("num_works", 99), ("num_towns", 1), ("num_towns", 999),
                                          ("max_turns", 0)])
def test_bad_options_raise_naming_the_option(option, value):
    with pytest.raises(ValueError, match=option):
        SearchQA(**{option: value})


def test_env_options_change_the_instance():
    env = SearchQA(num_works=6, num_towns=12, top_k=3)
    obs = env.reset(4)
    assert len(env.contents) == 3 * 6 * 2 + 12
    assert len(re.findall(r"\[Document \d\]", env.step(env.solution[0])[0])) == 3
    assert searchqa.two_search_policy(env, 4)[1] and obs.startswith("Question: ")


# --------------------------------------------------------------------------------------------- train.py
def test_train_smoke_run_on_searchqa(tmp_path):
    d = train.main(["--preset", "smoke", "--env", "searchqa", "--out-dir", str(tmp_path), "--name", "x",
                    "--no-progress", "--steps", "1", "--max-turns", "2"])
    rows = runlog.read_metrics(d)
    assert [r["step"] for r in rows] == [-1, 0]
    assert rows[-1]["rollout/num_trajectories"] == 4 and "val/success" in rows[-1]
