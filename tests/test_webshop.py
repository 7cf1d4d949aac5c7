"""webshop.py: the official reward on hand-built purchases, fuzzy matching, search, the page flow, invalid
actions, determinism and splits, the scripted shopper's rate, a rollout and a train.py smoke run."""
import copy
import re

import pytest

import envs
import rollout
import runlog
import train
from agentic import webshop as ws
from rollout import RolloutConfig
from agentic.webshop import WebShop


# ------------------------------------------------------------------------------------------ hand-built cases
def lotion(**kw):
    """A hand-built product with the official field names."""
    p = dict(asin="B000000001", query="body lotions", category="beauty",
             product_category="Beauty & Personal Care › Skin Care › Body › Body Lotions",
             Title="Acme Cruelty Free Body Lotion with Shea Butter for Dry Skin",
             Description="A rich lotion.", BulletPoints=["Absorbs fast."],
             Attributes=["cruelty free", "shea butter", "dry skin"], options={"scent": ["lavender", "vanilla"],
                                                                              "size": ["8 fl oz", "16 fl oz"]})
    p["name"] = p["Title"]
    return dict(p, **kw)


GOAL = dict(asin="B000000001", query="body lotions", product_category=lotion()["product_category"],
            name=lotion()["Title"], attributes=["cruelty free", "dry skin"], price_upper=30.0,
            goal_options={"scent": "lavender", "size": "16 fl oz"})


def test_reward_formula_on_hand_built_purchases():
    """raw = r_type * (attrs matched + options matched + [price ok]) / (attrs + options + 1); 2 attrs, 2 options."""
    right = {"scent": "lavender", "size": "16 fl oz"}
    assert ws.score(lotion(), GOAL, 20.0, right)[0] == 1.0
    # wrong option: 'vanilla' for 'lavender' -> (2 + 1 + 1) / 5
    raw, info = ws.score(lotion(), GOAL, 20.0, {"scent": "vanilla", "size": "16 fl oz"})
    assert raw == pytest.approx(0.8) and info["r_option"] == 0.5 and info["r_att"] == 1.0
    # an option left unchosen counts as unmatched
    assert ws.score(lotion(), GOAL, 20.0, {"size": "16 fl oz"})[0] == pytest.approx(0.8)
    # wrong attribute: the product lacks 'cruelty free' everywhere (attribute list, title, bullets, description)
    other = lotion(Title="Acme Body Lotion with Shea Butter for Dry Skin", Attributes=["shea butter", "dry skin"])
    assert ws.score(other, GOAL, 20.0, right)[0] == pytest.approx(0.8)
    # ... but an attribute found only in the description still counts (official substring rule)
    assert ws.score(dict(other, Description="cruelty free formula"), GOAL, 20.0, right)[0] == 1.0
    # over the price bound: (2 + 2 + 0) / 5; exactly at the bound is fine
    assert ws.score(lotion(), GOAL, 30.01, right)[0] == pytest.approx(0.8)
    assert ws.score(lotion(), GOAL, 30.0, right)[0] == 1.0
    # everything wrong but the type: (0 + 0 + 0) / 5
    bare = lotion(Title="Acme Body Lotion", Attributes=["DUMMY_ATTR"])
    assert ws.score(bare, GOAL, 99.0, {"scent": "vanilla", "size": "8 fl oz"})[0] == 0.0


def test_type_reward_levels():
    """r_type: 1 on a query or category match or title overlap > 0.2; 0.5 otherwise; 0.1 below 0.1; 0 at 0."""
    path = "Home & Kitchen › Bedding › Throws"
    far = lotion(query="throws", product_category=path)
    right = {"scent": "lavender", "size": "16 fl oz"}
    words = len(ws.title_words(GOAL["name"]))                                  # 8 title words in the goal
    for title, share, r_type in [("Acme Lotion Quilt", 2, 1.0), ("Acme Quilt", 1, 0.5), ("Zeta Quilt", 0, 0.0)]:
        info = ws.type_reward(dict(far, name=title), GOAL)
        assert info["title_score"] == pytest.approx(share / words) and info["r_type"] == r_type
        assert ws.score(dict(far, name=title), GOAL, 20.0, right)[0] == pytest.approx(r_type)
    near = dict(far, name="Zeta Quilt", product_category="Beauty & Personal Care › Skin Care › Face")
    assert ws.type_reward(near, GOAL)["category_match"] and ws.type_reward(near, GOAL)["r_type"] == 0.0
    long_goal = dict(GOAL, name=" ".join(f"w{i}" for i in range(11)) + " acme")  # overlap 1/12 < 0.1
    assert ws.type_reward(dict(far, name="Acme Quilt"), long_goal)["r_type"] == 0.1


def test_token_set_ratio_matches_thefuzz_and_the_goal_option_quirk():
    """Values from thefuzz 0.22.1; goal options enter as (name, value) pairs, as in the official get_reward."""
    cases = [("x-large", ("size", "x-large"), 100), ("large", ("size", "x-large"), 100),
             ("x-large", ("size", "large"), 83), ("blue", ("size", "x-large"), 25),
             ("fuzzy was a bear but not a dog", "fuzzy was a bear but not a cat", 92),
             ("8 fl oz", ("size", "16 fl oz (pack of 2)"), 83), ("long lasting", "long-lasting", 100),
             ("paraben free", "sulfate free", 58), ("7", ("size", "7.5"), 100), ("", "a", 0)]
    for a, b, expected in cases:
        assert ws.token_set_ratio(a, b) == expected, (a, b)
    assert ws.normalize_color("white | black") == "black"                       # first colour in COLOR_SET order
    assert ws.normalize_color(("color", "black")) == "black"                   # tuple: element equality
    assert ws.normalize_color(("color", "navy blue")) == ("color", "navy blue")
    goal = dict(GOAL, goal_options={"color": "black", "size": "x-large"})
    item = lotion(options={"color": ["white | black"], "size": ["large"]})
    # 'white | black' counts as black; 'large' is a token subset of 'size x-large': both match (official quirk)
    assert ws.score(item, goal, 20.0, {"color": "white | black", "size": "large"})[0] == 1.0


def test_bm25_against_a_hand_computation():
    """Lucene BM25 (k1 0.9, b 0.4) on a three-document corpus, with stop words and the plural stemmer."""
    docs = ["red socks", "red red shoes and the socks", "blue hats"]
    index = ws.BM25(docs, analyzer=ws.terms)
    assert [ws.stem(w) for w in ("lotions", "berries", "glasses", "dress", "species", "toes")] == \
        ["lotion", "berry", "glasse", "dress", "specy", "toes"]
    lengths, avg = [2, 4, 2], 8 / 3                                   # 'and', 'the' are stop words

    def term(tf, df, dl):
        return __import__("math").log(1 + (3 - df + 0.5) / (df + 0.5)) * tf * 1.9 / (tf + 0.9 * (0.6 + 0.4 * dl / avg))
    expected = [term(1, 2, lengths[0]) + term(1, 2, lengths[0]), term(2, 2, lengths[1]) + term(1, 2, lengths[1])]
    got = index.scores("red sock")
    assert got[:2].tolist() == pytest.approx(expected) and got[2] == 0
    assert index.top("red sock", 5) == [int(expected[1] > expected[0]), int(expected[1] <= expected[0])]
    assert index.top("green", 5) == [] and index.top("the and", 5) == []


# ---------------------------------------------------------------------------------------------- page flow
def actions_of(obs):
    return obs.rpartition("You must choose from these actions:")[2][:-1].split(", ")


def test_page_flow_and_available_actions():
    env = WebShop()
    obs = env.reset(3)
    goal = env.session["goal"]["instruction_text"]
    assert obs.startswith(f"Instruction: {goal}.We must buy a product within 10 actions.")   # RAGEN's "." join
    assert obs == f"Instruction: {goal}." + "\n".join(ws.RENDER_INSTRUCTIONS) + \
        "\n You must choose from these actions:search[<content>]."
    obs, reward, done, info = env.step(env.solution[0])                       # search -> results page 1
    hits = env.session["hits"]
    assert info["valid"] and info["effective"] and reward == 0 and not done and len(hits) == ws.SEARCH_RETURN_N
    page = f"Instruction: [SEP] {goal} [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] "
    assert obs.startswith(page + " [SEP] ".join(f"{p['asin']} [SEP] {p['Title']} [SEP] {p['Price']}"
                                                for p in hits[:10]) + ".We must buy")
    assert actions_of(obs) == ["click[back to search]", "click[next >]"] + [f"click[{p['asin'].lower()}]"
                                                                              for p in hits[:10]]
    for _ in range(5):                                                         # pages 2..5, then an empty page 6
        obs = env.step("click[next >]")[0]
    assert "Page 6 (Total results: 50) [SEP] < Prev [SEP] Next >." in obs   # still on the page
    assert actions_of(obs) == ["click[back to search]", "click[< prev]"]      # next > is hidden ...
    assert not env.step("click[next >]")[3]["valid"]                          # ... and refused
    for _ in range(5):
        obs = env.step("click[< prev]")[0]
    assert "Page 1 (Total results: 50) [SEP] Next > [SEP]" in obs
    product = hits[4]
    obs = env.step(f"click[{product['asin'].lower()}]")[0]                    # item page
    values = [v for vs in product["options"].values() for v in vs]
    assert actions_of(obs) == ["click[back to search]", "click[< prev]", "click[description]", "click[features]",
                               "click[reviews]", "click[buy now]"] + [f"click[{v}]" for v in values]
    assert f"[SEP] {product['Title']} [SEP] Price: {product['Price']} [SEP] Rating: N.A. [SEP] Description [SEP] " \
           "Features [SEP] Reviews [SEP] Buy Now." in obs
    name, vs = next(iter(product["options"].items()))
    out, _, _, info = env.step(f"click[{vs[-1]}]")                            # an option: recorded, text unchanged
    assert info["valid"] and not info["effective"] and out == obs and env.session["options"] == {name: vs[-1]}
    obs = env.step("click[features]")[0]                                      # sub-page, back, options kept
    assert actions_of(obs) == ["click[back to search]", "click[< prev]"]
    assert obs.startswith(f"Instruction: [SEP] {goal} [SEP] Back to Search [SEP] < Prev [SEP] "
                          + " [SEP] ".join(product["BulletPoints"]) + ".")
    assert env.step("click[< prev]")[0] == out and env.session["options"] == {name: vs[-1]}
    obs = env.step("click[< prev]")[0]                                        # item -> its results page
    assert "Page 1 (Total results: 50)" in obs and env.session["options"] == {}
    obs = env.step("click[back to search]")[0]                                # the search page, official text
    assert obs.startswith(f"WebShop [SEP] Instruction: [SEP] {goal} [SEP] Search.")
    assert actions_of(obs) == ["search[<content>]"]
    assert env.num_actions == 17 and not env.done                            # the refused click did not count


def test_invalid_actions_change_nothing():
    env = WebShop()
    obs = env.reset(11)
    for bad in ("click[buy now]", "click[next >]", "search[]", "search[ ]", "buy", "find[socks]", "click[search]",
                "", None):
        assert env.step(bad)[:3] == (obs, 0.0, False) and env.num_actions == 0
    obs = env.step("search[socks and lotion]")[0]
    asin = env.session["hits"][0]["asin"].lower()
    for bad in ("search[socks]", "click[buy now]", "click[< prev]", "click[b0zzzzzzzz]", "click[ next >]"):
        out, reward, done, info = env.step(bad)
        assert (out, reward, done, info["valid"], info["effective"]) == (obs, 0.0, False, False, False)
    assert env.num_actions == 1
    assert env.step(f"CLICK[{asin.upper()}]")[3]["valid"]                    # case-insensitive, as officially
    assert env.step("click[buy now] thanks")[3]["valid"] and env.done         # text after ']' is ignored (regex)
    assert env.step("click[back to search]")[:3] == (env.render(), 0.0, True)  # over: everything is refused


def test_buying_ends_the_episode_with_binary_or_dense_reward():
    for dense in (False, True):
        env = WebShop(dense=dense)
        env.reset(10003)
        goal = env.session["goal"]
        sol = env.solution
        assert len(goal["goal_options"]) >= 1 and sol[-1] == "click[buy now]"
        for action in sol[:-2]:                                               # skip the last option click
            env.step(action)
        obs, reward, done, info = env.step("click[buy now]")
        n = len(goal["attributes"]) + len(goal["goal_options"]) + 1
        assert done and not env.success and info["raw_reward"] == pytest.approx((n - 1) / n) and info["found"]
        assert reward == (pytest.approx((n - 1) / n) if dense else 0.0)
        assert obs.startswith(f"Thank you for shopping with us! [SEP] Purchased [SEP] asin [SEP] {goal['asin']}")
        env.reset(10003)
        rewards = [env.step(a)[1] for a in env.solution]
        assert rewards[-1] == 1.0 and sum(rewards) == 1.0 and env.success


# --------------------------------------------------------------------------------- determinism and splits
def test_same_seed_same_episode_in_any_order_and_catalogue_is_fixed():
    a, b = WebShop(), WebShop()
    first = a.reset(42)
    b.reset(7), b.step("search[red socks]")
    assert b.reset(42) == first and a.solution == b.solution
    clone = copy.deepcopy(a)
    assert clone.shop is a.shop                                               # read-only, shared
    assert [a.step(x)[:3] for x in a.solution] == [clone.step(x)[:3] for x in clone.solution]
    fresh = ws.Shop(300)                                                      # rebuilt from scratch: identical
    assert fresh.products == a.shop.products and fresh.goals == a.shop.goals
    assert len({WebShop().reset(s) for s in range(20)}) == 20


def test_goals_follow_the_official_rules_and_splits_are_disjoint():
    s = ws.shop(300)
    assert len(s.products) == 300 and len({p["asin"] for p in s.products}) == 300
    assert 1000 < len(s.goals) < 1600 and {len(v) for v in s.splits.values()} == {128, 256, 897}
    for g in s.goals[:200]:
        p = s.by_asin[g["asin"]]
        lower = [x for x in ws.PRICE_RANGE if x > p["price"]][:4]
        assert g["price_upper"] in lower[1:] and p["price"] <= g["price_upper"]   # max of two of four
        opts = ", and ".join(f"{k}: {v}" for k, v in g["goal_options"].items())
        assert g["instruction_text"] == p["instruction_text"] + (f" with {opts}" if opts else "") + \
            f", and price lower than {g['price_upper']:.2f} dollars"
        assert sorted(g["goal_options"]) == list(g["goal_options"]) and set(g["attributes"]) <= set(p["Attributes"])
    env = WebShop()
    val = {id(env.goal_for(seed)) for seed in range(123, 123 + 512)}
    train_ = {id(env.goal_for(seed)) for seed in range(10000, 12000)}
    assert len(val) == 256 and len(train_) == 897 and not val & train_
    assert id(WebShop(split="test").goal_for(5)) == id(s.goals[5]) and id(WebShop(split="val").goal_for(0)) \
        == id(s.goals[128]) and id(WebShop(split="train").goal_for(3)) == id(s.goals[384 + 3])


def test_option_validation():
    for bad in (dict(num_products=10), dict(num_products=True), dict(split="dev"), dict(dense="yes"),
                dict(max_turns=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            WebShop(**bad)
    with pytest.raises(ValueError, match="valid options"):
        envs.make_env("webshop", shuffle=True)
    small = envs.make_env("webshop", num_products=60, dense=True)
    assert len(small.shop.products) == 60 and small.reset(0).startswith("Instruction: Find me ")


# ------------------------------------------------------------------------------------- policies and runs
def test_scripted_shopper_reaches_the_right_product_in_most_episodes():
    env = WebShop()
    found = success = 0
    for seed in list(range(100)) + list(range(10000, 10100)):
        acts, reward, info = ws.run_scripted(env, seed)
        assert len(acts) <= env.max_actions and env.done
        found += info["found"]
        success += env.success
    assert found >= 140 and success >= 180                                    # measured: 160 and 193 of 200


def test_every_goal_is_reachable_within_the_budget():
    """For every goal of every pool, the known solution (search, click, options, buy) scores 1."""
    for split, pool in ws.shop(300).splits.items():
        env = WebShop(split=split)
        for i in range(len(pool)):
            env.reset(i)
            assert len(env.solution) <= env.max_actions
            assert [env.step(a)[1] for a in env.solution][-1] == 1.0 and env.success


def test_rollout_with_the_scripted_shopper_solves_it():
    """The shopper, fed the rollout's own observations (decoded context), buys the right item end to end."""
    import policy

    model, tok = policy.load("tiny")
    shoppers = {}

    def shopper(model, tokenizer, contexts, keys, **kw):
        outs = []
        for key, ctx in zip(keys, contexts):
            text = tokenizer.decode(ctx)
            obs = text[text.rindex("State:\n") + len("State:\n"):text.rindex("\nYou have ")]
            action = shoppers.setdefault(key, ws.ScriptedShopper())(obs)
            ids = tokenizer.encode(f" shop </think> <answer>{action}</answer>", add_special_tokens=False)
            outs.append((ids, [0.0] * len(ids)))
        return outs

    cfg = RolloutConfig(env="webshop", max_context=12000)
    trajs = rollout.rollout(model, tok, cfg, [125, 10001], 2, generate_fn=shopper)
    for tr in trajs:
        assert tr.success and tr.ret == 1.0 and tr.end_reason == "done" and tr.penalty == 0
        actions = [a for t in tr.turns for a in t.actions]
        assert actions[0].startswith("search[") and actions[-1] == "click[buy now]"
        assert re.fullmatch(r"click\[b0[0-9a-z]{8}\]", actions[1])


def test_train_smoke_run_on_webshop(tmp_path):
    d = train.main(["--preset", "smoke", "--env", "webshop", "--out-dir", str(tmp_path), "--name", "x",
                    "--no-progress", "--steps", "1", "--max-turns", "2", "--val-envs", "1", "--mi-every", "0"])
    rows = runlog.read_metrics(d)
    assert [r["step"] for r in rows] == [-1, 0]
    assert rows[-1]["rollout/num_trajectories"] == 4 and rows[-1]["rollout/turns"] <= 2 and "val/success" in rows[-1]
