"""WebShop-mini: an offline, self-contained WebShop (multi-turn web shopping) for RAGEN-2.

What it implements (paper section 4.1 / App. B.1 use WebShop [Yao et al. 2022] through the official RAGEN wrapper
ragen/env/webshop/env.py and its back end, the webshop-minimal package; we follow that code):
  * catalogue  a generated product dump (webshop_catalogue.py; fixed seed: the same catalogue for every
               episode, like the official items_shuffle file): 25 product types in 6 categories, each product
               with an ASIN, title, description, bullet points, a hidden attribute list, options (color / size /
               flavor ...) and a price or a price range ("$12.5 to $18.0"; the price used for scoring is drawn
               inside the range).
  * goals      as the official synthetic goals: about 60% of the products carry an instruction ("Find me <attrs>
               <product type> with <attrs> for <attrs>"); every combination of such a product's option values is
               one goal, "<instruction> with color: X, and size: Y, and price lower than P.00 dollars", where P is
               the larger of two draws among the first four multiples of 10 above the product's price.
  * pages      the official page flow rendered as the official "simple" text mode (visible page strings joined
               by " [SEP] "): search page -> results (BM25 top 50, 10 per page, `click[next >]`, `click[< prev]`)
               -> item page (options, Description / Features / Reviews sub-pages, `click[buy now]`). Each
               observation is the page text + "." + the 9 official hint lines + " You must choose from these
               actions:" + the available actions, exactly as RAGEN's prepare_render_cache builds it.
  * reward     the official score, given at `click[buy now]` (which ends the episode):
               raw = r_type * (#goal attributes matched + #goal options matched + [price <= bound])
                     / (#attributes + #options + 1),
               binarised as RAGEN does (reward 1 iff raw >= 1); `dense=True` returns raw instead.
               success = (raw >= 1). 9 turns x 1 action, 9 actions per episode, no step penalty.
  * split      goals are permuted once and cut like the official test / val / train pools (first 10% test, next
               20% val, the rest train); split="auto" maps seeds < 10000 (validation seeds, val_seed + i) to the
               val pool and seeds >= 10000 (training seeds, train_seed + ...) to the train pool, so validation
               goals are never trained on.

Options: num_products (300: 1281 goals, 128 test / 256 val / 897 train), split ("auto"), dense (False: the
binarised reward; the paper's Table 3 calls WebShop's reward dense, RAGEN's code binarises), and the budgets
(9 turns x 1 action, 9 actions, 200-word hint). A results page is ~800 SmolLM2 tokens, so a 9-turn episode needs
`--max-context` ~8000 (the official config uses 15000); with the default 3600 long episodes end as truncated.

Paper / official code vs ours (deliberate differences):
  * search: pyserini/Lucene BM25 (k1 0.9, b 0.4, Porter stemmer) -> the same Okapi BM25 in numpy, same k1/b and
    document text (title + description + first bullet + options), Lucene's English stop words, a plural-only
    stemmer (Lucene's EnglishMinimalStemmer) instead of Porter.
  * fuzzy matching: thefuzz/rapidfuzz token_set_ratio -> a pure-Python copy of the same formula (Indel similarity
    on token sets, same preprocessing and rounding; equal to thefuzz 0.22 on 20,000 random pairs when written).
    The official quirk is kept: goal options are compared as ("name", "value") pairs, so a purchased "large"
    matches a goal "size: x-large" and "white | black" counts as "black".
  * r_type: spaCy (en_core_web_sm) noun overlap of the two titles -> overlap of their stop-word-filtered words.
    With that one swap, `score` equalled the official get_reward on 3,000 random purchases when written.
  * an invalid action (unknown click, search off the search page, bad syntax) changes nothing (not even the
    first observation's text) and is reported valid=False; officially it still uses one of the 9 actions, and a
    search typed on any page is executed. With 1 action per turn it costs the turn here too (and the rollout's
    no-valid-action format penalty applies, which RAGEN does not give for WebShop). "Click[...]" is accepted in
    any case (officially only lower-case "click" / "search").
  * `click[next >]` on an empty page past the last result is neither listed (as officially) nor accepted.
  * the done page is shortened to the purchase and its score; reviews are empty and ratings "N.A." (as in the
    official small dump, which loads no reviews). No human goals, no image features, no "Attributes" page.
    Every other page's text and clickables equal the official templates rendered by jinja2 + BeautifulSoup.
Run: `python envs.py webshop --seed 3 --show` / `--play`; `python -m agentic.webshop --episodes 200` runs the scripted
shopper and prints its success rate and the step time.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache

import numpy as np

from .bm25 import BM25, STOP_WORDS
from env_base import Env, _int_opt
from .webshop_catalogue import PRICE_RANGE, TYPES, make_goals, make_product  # noqa: F401 (PRICE_RANGE: tests)

# ------------------------------------------------------------------------------------- official constants
RENDER_INSTRUCTIONS = [         # ragen/env/webshop/env.py, verbatim
    "We must buy a product within 10 actions. It doesn't have to match perfectly with description.",
    "Search term should not include details like size, color.",
    "Never search for more than 2 times.",
    "Do not be too strict about the description, it's more important to buy one that is close enough within "
    "action limit.",
    "Prioritize click a product in the current page over going to next page.",
    "Almost never click[next >] for more than 2 times.",
    "Almost never click[< prev] unless you are sure the product is on one of the previous pages.",
    "If you have less than 3 actions left, just buy the first product you see in the current page.",
    "If an matching option exists, make sure to click[size] then click[color], one at a time, before click[buy "
    "now], but don't have to if only 1 action left, in that case you just click[buy now]. Never click description."]
ENV_INSTRUCTION = (             # config/envs.yaml, WebShop tag, verbatim
    "You are browsing an online shop. Based on the instruction, buy a product that close to the production "
    "description. You need to search, read the search results, pick a product, choose the size and color and buy. "
    "You should only choose action from the available actions list provided later.  Example process: I need a "
    "gingko light and 20x20 pillow cover that is hand painted. First search[gingko light 20x20 pillow cover hand "
    "painted], answer format: <answer>search[blanket with fleece throw]</answer>. Valid answer is search[<keywords>] "
    "or click[<clickable>].")
SEARCH_RETURN_N, PRODUCT_WINDOW = 50, 10          # hits per search, products per results page
SPLITS = {"test": 0.1, "val": 0.2}                # fractions of the permuted goal list; the rest is train
TRAIN_SEEDS_FROM = 10000                          # split="auto": seeds >= this draw training goals
CATALOGUE_SEED = 2022
SUB_PAGES = ("description", "features", "reviews")
COLOR_SET = (   # webshop_minimal/normalize.py: an option is reduced to the first of these it contains
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy camel "
    "camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral cranberry "
    "cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass gray green grey "
    "heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon mauve merlot midnight "
    "mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter pink plum purple rainbow red "
    "rose royal rust sand sapphire seashell silver skull slate steel stone stonewash sunflower tan taupe teal tiger "
    "turquoise violet walnut wheat white wine yellow").split()
class Shop:
    """The read-only catalogue, goals, split pools and search index (the official SimServer, built once)."""

    def __init__(self, num_products):
        rng = np.random.default_rng(CATALOGUE_SEED)
        kinds = [TYPES[i % len(TYPES)] for i in rng.permutation(num_products)]     # balanced types, shuffled
        asins = set()
        while len(asins) < num_products:                                           # "B0" + 8 of [0-9A-Z]
            asins.add("B0" + "".join(rng.choice(list("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"), size=8)))
        self.products = [make_product(rng, k, a) for k, a in zip(kinds, sorted(asins))]
        self.by_asin = {p["asin"]: p for p in self.products}
        goals = make_goals(self.products, rng)
        self.goals = [goals[i] for i in rng.permutation(len(goals))]                # the official fixed shuffle
        n = len(self.goals)
        n_test, n_val = int(n * SPLITS["test"]), int(n * SPLITS["val"])
        self.splits = {"test": range(0, n_test), "val": range(n_test, n_test + n_val),
                       "train": range(n_test + n_val, n)}
        self.index = BM25([product_document(p) for p in self.products], analyzer=terms)

    def __deepcopy__(self, memo):
        return self                                   # shared, read-only: cloning an env keeps the same shop

    def search(self, keywords: str):
        """Top SEARCH_RETURN_N products for the keywords (official get_top_n_product_from_keywords)."""
        return [self.products[i] for i in self.index.top(keywords, SEARCH_RETURN_N)]


@lru_cache(maxsize=4)
def shop(num_products: int = 300) -> Shop:
    """The catalogue for a size (cached per process, like the official per-process SimServer singleton)."""
    return Shop(num_products)


# --------------------------------------------------------------------------------------------------- search
def product_document(p) -> str:
    """Indexed text, as setup_search_engine.py: title, description, first bullet, 'name: v1, v2, and name: ...'."""
    options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in p["options"].items())
    return " ".join([p["Title"], p["Description"], p["BulletPoints"][0], options]).lower()


def stem(word: str) -> str:
    """Lucene's EnglishMinimalStemmer: plural 's' only ('lotions' -> 'lotion', 'berries' -> 'berry')."""
    n = len(word)
    if n < 3 or word[-1] != "s" or word[-2] in "us":
        return word
    if word[-2] == "e":
        if n > 3 and word[-3] == "i" and word[-4] not in "ae":
            return word[:-3] + "y"
        if word[-3] in "iaoe":
            return word
    return word[:-1]


def terms(text: str) -> list:
    """Lower-cased alphanumeric tokens, English stop words dropped, plural-stemmed (query and documents)."""
    return [stem(w) for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOP_WORDS]


# -------------------------------------------------------------------------------------------------- reward
def _process(s) -> str:
    """thefuzz full_process: str(), ASCII only, lower case, every non-alphanumeric character -> a space."""
    return re.sub(r"[^a-z0-9]", " ", str(s).encode("ascii", "ignore").decode().lower()).strip()


def _lcs(a: str, b: str) -> int:
    """Longest common subsequence length (rapidfuzz's Indel distance is len(a) + len(b) - 2 * lcs)."""
    row = [0] * (len(b) + 1)
    for ca in a:
        diag = 0
        for j, cb in enumerate(b):
            diag, row[j + 1] = row[j + 1], diag + 1 if ca == cb else max(row[j + 1], row[j])
    return row[-1]


def token_set_ratio(s1, s2) -> int:
    """thefuzz.fuzz.token_set_ratio: rapidfuzz's token-set formula on processed strings, rounded to an int.

    With sect = the shared tokens, ab / ba = the tokens only in s1 / s2 (each sorted, space-joined), it is the
    best Indel similarity 100 * (1 - distance / total length) of the pairs (sect+ab, sect+ba), (sect, sect+ab),
    (sect, sect+ba); 100 when one token set contains the other."""
    a, b = set(_process(s1).split()), set(_process(s2).split())
    if not a or not b:
        return 0
    sect, ab, ba = " ".join(sorted(a & b)), " ".join(sorted(a - b)), " ".join(sorted(b - a))
    if sect and (not ab or not ba):
        return 100
    gap = 1 if sect else 0                                   # the space between sect and the rest
    len_ab, len_ba = len(sect) + gap + len(ab), len(sect) + gap + len(ba)
    dist = len(ab) + len(ba) - 2 * _lcs(ab, ba)              # sect is shared, so only the rests differ
    best = 100 - 100 * dist / (len_ab + len_ba)
    if sect:                                                 # sect vs sect+ab: the distance is the extra text
        best = max(best, 100 - 100 * (gap + len(ab)) / (len(sect) + len_ab),
                   100 - 100 * (gap + len(ba)) / (len(sect) + len_ba))
    return int(round(best))


def normalize_color(option):
    """Official normalize_color: the first COLOR_SET entry `in` the option (substring of a string; equal to an
    element of a tuple, which is how the official code passes the goal's (name, value) pairs)."""
    return next((c for c in COLOR_SET if c in option), option)


def title_words(title: str) -> set:
    """Stand-in for the official spaCy noun extraction: the title's words minus stop words."""
    return {w for w in re.findall(r"[a-z0-9]+", title.lower()) if w not in STOP_WORDS}


def type_reward(product, goal) -> dict:
    """Official get_type_reward: 1, 0.5, 0.1 or 0 from query / category / title overlap."""
    query_match = product["query"] == goal["query"]
    cats = lambda p: {x.strip() for x in p["product_category"].split("›")}  # noqa: E731
    category_match = len(cats(product) & cats(goal)) >= 2
    desired = title_words(goal["name"])
    title_score = len(title_words(product["name"]) & desired) / len(desired) if desired else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return dict(r_type=r_type, query_match=query_match, category_match=category_match, title_score=title_score)


def score(product, goal, price, options) -> tuple:
    """Official get_reward: (raw score in [0, 1], components). options: {option name: chosen value}."""
    text = " ".join([product["Title"], " ".join(product["BulletPoints"]), product["Description"]]).lower()
    n_attr = sum(any(token_set_ratio(p, g) > 85 for p in product["Attributes"]) or g in text
                 for g in goal["attributes"])
    bought = [normalize_color(o) for o in options.values()]
    wanted = [normalize_color(o) for o in goal["goal_options"].items()]       # (name, value) pairs, as officially
    n_opt = sum(any(token_set_ratio(p, g) > 85 for p in bought) for g in wanted)
    r_price = price <= goal["price_upper"]
    n = len(goal["attributes"]) + len(wanted) + 1
    kind = type_reward(product, goal)
    raw = kind["r_type"] * (n_attr + n_opt + r_price) / n
    return raw, dict(kind, r_att=n_attr / len(goal["attributes"]), r_option=n_opt / len(wanted) if wanted else None,
                     r_price=bool(r_price))


# --------------------------------------------------------------------------------------------------- pages
def page_view(shop_, session) -> tuple:
    """(page text, clickables, has_search_bar) of the current page, as the official templates render in the
    "simple" text mode. Clickables are lower-cased, in the official order: buttons, product links, options."""
    page, goal_text = session["page"], session["goal"]["instruction_text"]
    head = ["Instruction:", goal_text, "Back to Search"]
    if page == "start":
        return " [SEP] ".join(["WebShop", "Instruction:", goal_text, "Search"]), ["search"], True
    if page == "results":
        n, hits = session["page_no"], session["hits"]
        shown = hits[(n - 1) * PRODUCT_WINDOW:n * PRODUCT_WINDOW]
        nav = (["< Prev"] if n > 1 else []) + ["Next >"]
        fields = head + [f"Page {n} (Total results: {len(hits)})"] + nav
        for p in shown:
            fields += [p["asin"], p["Title"], p["Price"]]
        return " [SEP] ".join(fields), ["back to search"] + [x.lower() for x in nav] + [p["asin"].lower()
                                                                                         for p in shown], False
    p = shop_.by_asin[session["asin"]]
    if page == "item":
        fields = head + ["< Prev"]
        for name, values in p["options"].items():
            fields += [name] + values
        fields += [p["Title"], f"Price: {p['Price']}", f"Rating: {p['Rating']}", "Description", "Features",
                   "Reviews", "Buy Now"]
        values = [v for vs in p["options"].values() for v in vs]
        return " [SEP] ".join(fields), ["back to search", "< prev", *SUB_PAGES, "buy now", *values], False
    if page in SUB_PAGES:
        body = {"description": [p["Description"]], "features": p["BulletPoints"], "reviews": []}[page]
        return " [SEP] ".join(head + ["< Prev"] + body), ["back to search", "< prev"], False
    # done page (shortened: the official one also lists empty MTurk and debugging fields)
    fields = ["Thank you for shopping with us!", "Purchased", "asin", p["asin"], "options",
              json.dumps(session["options"]), "Your score (min 0.0, max 1.0)", str(session["raw"])]
    return " [SEP] ".join(fields), [], False


def available_actions(clickables, has_search_bar) -> list:
    """RAGEN's get_available_actions: search[<content>] where there is a search bar, click[x] for each clickable;
    click[next >] is dropped on an empty results page past the last hit."""
    actions = (["search[<content>]"] if has_search_bar else []) + [f"click[{c}]" for c in clickables if c != "search"]
    if actions == ["click[back to search]", "click[< prev]", "click[next >]"]:
        actions.remove("click[next >]")
    return actions


def parse_action(action):
    """('search' | 'click', lower-cased argument) from 'search[...]' / 'click[...]' (official regex), else None."""
    m = re.match(r"(.+)\[(.+)\]", action.strip()) if isinstance(action, str) else None
    if m is None or m.group(1).strip().lower() not in ("search", "click"):
        return None
    return m.group(1).strip().lower(), m.group(2).lower()


# ------------------------------------------------------------------------------------------------- the env
class WebShop(Env):
    """Find and buy the product a shopping instruction describes (official RAGEN `WebShop` tag)."""
    name = "webshop"

    def __init__(self, num_products=300, split="auto", dense=False, max_turns=9, max_actions_per_turn=1,
                 max_actions=9, max_tokens=200):
        """num_products: catalogue size (>= 50); split: auto / train / val / test goal pool; dense: reward the raw
        score instead of the binarised one (the paper's Table 3 calls WebShop's reward dense; RAGEN binarises)."""
        super().__init__(max_turns, max_actions_per_turn, max_actions, max_tokens)
        self.num_products = _int_opt("num_products", num_products, lo=50)
        if split not in ("auto", "train", "val", "test"):
            raise ValueError(f"split must be one of ['auto', 'train', 'val', 'test'], got {split!r}")
        if not isinstance(dense, bool):
            raise ValueError(f"dense must be True or False, got {dense!r}")
        self.split, self.dense = split, dense
        self.instructions = ENV_INSTRUCTION + "\n" + self.protocol("click[buy now]")

    @property
    def shop(self) -> Shop:
        return shop(self.num_products)

    def goal_for(self, seed: int) -> dict:
        """The official seed -> goal rule on our pools: pool[seed % len(pool)]."""
        split = self.split if self.split != "auto" else ("train" if seed >= TRAIN_SEEDS_FROM else "val")
        pool = self.shop.splits[split]
        if len(pool) == 0:
            raise ValueError(f"split={split!r} holds no goal with num_products={self.num_products}")
        return self.shop.goals[pool[seed % len(pool)]]

    def _reset(self, seed):
        goal = self.goal_for(seed)
        self.session = dict(goal=goal, page="start", keywords=None, page_no=None, hits=[], asin=None, options={},
                            raw=None)
        self.text = "Instruction: " + goal["instruction_text"]        # RAGEN's first render: the instruction only
        self.solution = self._solution(goal)

    def _solution(self, goal):
        """Search the instruction (or the title), page to the goal product, click it, its options, buy now."""
        for query in (instruction_core(goal["instruction_text"])[0], goal["name"].lower()):
            ranks = [p["asin"] for p in self.shop.search(query)]
            if goal["asin"] in ranks:
                pages = ranks.index(goal["asin"]) // PRODUCT_WINDOW
                return ([f"search[{query}]"] + ["click[next >]"] * pages + [f"click[{goal['asin'].lower()}]"]
                        + [f"click[{v}]" for v in goal["goal_options"].values()] + ["click[buy now]"])
        return None

    def view(self):
        return page_view(self.shop, self.session)

    def step(self, action):
        """An action that is not available on this page is invalid: nothing changes (envs.py contract)."""
        if self.seed is not None and not self.done:
            act = parse_action(action)
            _, clickables, search_bar = self.view()
            ok = act is not None and (act[1].strip() != "" and search_bar if act[0] == "search" else
                                      f"click[{act[1]}]" in available_actions(clickables, search_bar))
            if not ok:
                return self.render(), 0.0, self.done, self._info(valid=False, effective=False)
        return super().step(action)

    def _step(self, action):
        """One valid action: the official SimServer transitions."""
        kind, arg = parse_action(action)
        s, before = self.session, self.view()[0]
        reward, info = 0.0, {}
        if kind == "search":
            s.update(page="results", keywords=arg, page_no=1, hits=self.shop.search(arg), asin=None, options={})
        elif arg == "back to search":
            s.update(page="start", keywords=None, page_no=None, hits=[], asin=None, options={})
        elif s["page"] == "results" and arg in ("next >", "< prev"):
            s["page_no"] += 1 if arg == "next >" else -1
        elif s["page"] == "results":                                    # a product link
            s.update(page="item", asin=arg.upper())
        elif s["page"] == "item" and arg == "< prev":                   # back to the same results page
            s.update(page="results", asin=None, options={})
        elif s["page"] == "item" and arg in SUB_PAGES:
            s["page"] = arg
        elif s["page"] in SUB_PAGES:                                    # "< prev" from a sub-page
            s["page"] = "item"
        elif arg == "buy now":
            product = self.shop.by_asin[s["asin"]]
            raw, info = score(product, s["goal"], product["price"], s["options"])
            s.update(page="done", raw=raw)
            self.done, self.success = True, raw >= 1.0
            reward = raw if self.dense else float(raw >= 1.0)           # RAGEN: 1 iff raw >= 1
            info = dict(info, raw_reward=raw, found=s["asin"] == s["goal"]["asin"])
        else:                                                           # an option value on the item page
            name = next(n for n, vs in self.shop.by_asin[s["asin"]]["options"].items() if arg in vs)
            s["options"][name] = arg
        self.text = self.view()[0]
        return reward, dict(info, effective=self.text != before)        # option clicks do not change the text

    def render(self) -> str:
        """RAGEN's render cache: page text + '.' + the 9 hint lines + the list of available actions."""
        _, clickables, search_bar = self.view()
        return (self.text + "." + "\n".join(RENDER_INSTRUCTIONS) + "\n You must choose from these actions:"
                + ", ".join(available_actions(clickables, search_bar)) + ".")


# ----------------------------------------------------------------------------------------- scripted policy
def instruction_core(text: str) -> tuple:
    """Split an instruction into (what to search, {option name: value}, price bound or None)."""
    bound = None
    m = re.search(r", and price lower than ([0-9.]+) dollars$", text)
    if m:
        bound, text = float(m.group(1)), text[:m.start()]
    options = {}
    if ":" in text:                                                     # "... with color: x, and size: y"
        cut = text.rfind(" with ", 0, text.index(":"))
        for pair in text[cut + len(" with "):].split(", and "):
            name, _, value = pair.partition(": ")
            options[name] = value
        text = text[:cut]
    return text.lower(), options, bound


class ScriptedShopper:
    """A policy that reads the goal from the observations: search the instruction without options and price;
    on the results page click the product whose title shares most words with it (lowest listed price within the
    bound; ties: the higher-ranked); on its page, if one of the goal's option values is missing and the budget
    allows, go back and try the next best product, else click the goal's option values and buy. Memory: the goal,
    the products tried, the options clicked, the actions used."""

    def __init__(self, max_actions: int = 9):
        self.max_actions, self.used = max_actions, 0
        self.goal, self.tried, self.clicked = None, [], set()

    def __call__(self, obs: str) -> str:
        self.used += 1
        return self._act(obs)

    def _act(self, obs):
        page, _, tail = obs.partition("." + RENDER_INSTRUCTIONS[0])
        actions = tail.rpartition("You must choose from these actions:")[2].rstrip(".").split(", ")
        fields = page.split(" [SEP] ")
        if self.goal is None:                                            # first observation: "Instruction: ..."
            self.goal = instruction_core(page[len("Instruction: "):] if len(fields) == 1 else
                                         fields[fields.index("Instruction:") + 1])
        core, options, bound = self.goal
        left = self.max_actions - self.used                              # actions left after this one
        if "search[<content>]" in actions:
            return f"search[{core}]"
        if "click[buy now]" in actions:                                  # item page
            missing = any(f"click[{v}]" not in actions for v in options.values())
            if missing and left >= 3 + len(options):                     # < prev, click, options, buy now
                return "click[< prev]"
            for value in options.values():
                if f"click[{value}]" in actions and value not in self.clicked and left >= 1:
                    self.clicked.add(value)
                    return f"click[{value}]"
            return "click[buy now]"
        products = [(fields[i], fields[i + 1], fields[i + 2]) for i in range(len(fields) - 2)
                    if re.fullmatch(r"B0[0-9A-Z]{8}", fields[i]) and f"click[{fields[i].lower()}]" in actions]
        fresh = [p for p in products if p[0] not in self.tried]
        if fresh:                                                        # results page: best title match
            want = set(terms(core))
            fits = [p for p in fresh if bound is None or float(p[2].split()[0].lstrip("$")) <= bound] or fresh
            best = max(fits, key=lambda p: len(want & set(terms(p[1]))))   # max keeps the first of the best
            self.tried.append(best[0])
            self.clicked = set()
            return f"click[{best[0].lower()}]"
        return "click[< prev]" if "click[< prev]" in actions else actions[0]


def run_scripted(env: WebShop, seed: int):
    """One episode of the scripted shopper: (actions, final step's reward, final info)."""
    obs, policy, actions, reward, info = env.reset(seed), ScriptedShopper(env.max_actions), [], 0.0, {}
    while not env.done and len(actions) < env.max_actions:
        actions.append(policy(obs))
        obs, reward, _, info = env.step(actions[-1])
    return actions, reward, info


if __name__ == "__main__":
    import argparse
    import time

    ap = argparse.ArgumentParser(description="WebShop-mini: scripted-shopper success rate and step time")
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--split", default="auto")
    a = ap.parse_args()
    t0 = time.perf_counter()
    env = WebShop(split=a.split)
    env.reset(0)
    print(f"catalogue: {len(env.shop.products)} products, {len(env.shop.goals)} goals "
          f"({', '.join(f'{k} {len(v)}' for k, v in env.shop.splits.items())}), built in "
          f"{time.perf_counter() - t0:.2f} s")
    found = success = steps = 0
    t0 = time.perf_counter()
    for seed in range(a.first_seed, a.first_seed + a.episodes):
        acts, r, info = run_scripted(env, seed)
        found += bool(info.get("found"))
        success += env.success
        steps += len(acts) + 1                     # + the reset
    dt = time.perf_counter() - t0
    print(f"scripted shopper over {a.episodes} seeds: right product {found / a.episodes:.1%}, "
          f"success (raw score 1) {success / a.episodes:.1%}; {1e6 * dt / steps:.0f} us per reset/step")
