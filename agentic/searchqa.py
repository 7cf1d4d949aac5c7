"""SearchQA-mini: multi-turn search-and-answer over a small fictional encyclopedia (an offline SearchQA).

What it implements (paper section 4.1 / App. B.1 "SearchQA", and the official code's `search` environment,
mll-lab-nu/RAGEN, adapted there from rllm: HotpotQA questions, `search[...]` / `finish[...]`, a Wikipedia
retriever). The agent gets a two-hop question, may search several times, and answers once:
  * knowledge base: generated per instance from the seed: 32 short passages by default (`"Title"\\ntext`,
    the corpus format of the official retriever) about fictional people, organisations, novels, films and towns,
    plus distractors that share names and words with the gold passages (a novel and a film with the same
    title, organisations sharing a word, people sharing a first name or a surname).
  * questions: HotpotQA-style bridge questions ("In which town was the founder of Velmora Records born?"):
    hop 1 finds the bridge (the founder's name) in the passage of the named work, hop 2 finds the answer in
    the bridge's own passage, which never mentions the work. Instances are re-drawn (derived seeds) until
    searching the question text itself does not return the hop-2 passage, so the answer needs two searches.
  * retrieval: Okapi BM25 over the instance's passages (bm25.py), top-k documents formatted as the
    official client: `[Document i] (ID: doc_i, Score: s.sss)` + content, each content cut at 800 characters
    and the whole block at 4000 (+ "...").
  * actions and observations: the official strings. `search[q]` shows the results; `finish[a]` grades `a` and
    ends the episode; any other text is, as in the official env, read as a final answer (`\\boxed{}`, bold,
    "the answer is ...", first sentence), graded, and ends the episode with info["valid"] = False (this is
    the one documented exception to "an invalid action changes nothing"; `fallback="invalid"` instead
    ignores such text). 5 turns x 1 action, 10 actions, 10 search steps, 300-word length hint.
  * reward (SQuAD/HotpotQA normalisation: lower case, no punctuation, no articles a/an/the, single spaces):
    exact match 1.0; else token F1 if F1 >= 0.3, else 0 (yes/no/noanswer must match exactly). Success = the
    answer earned a reward > 0.

Why per-instance worlds: every seed draws its own facts from the same name pools (who founded what, who was
born where), so facts memorised on training seeds (10000+) say nothing about validation seeds (123+), no
train/validation split is needed, and a question is answerable only by reading this instance's passages (the
same question text may recur under another seed with another answer). Why numpy BM25 (bm25.py): ~40 lines that a test
checks by hand; `rank-bm25` (last release 2022) floors negative idf with an epsilon rule and `bm25s` needs
scipy, which nanoRAGEN avoids.

Left out: HotpotQA data, the 21M-passage wiki-18 corpus and its E5 dense retriever (a FAISS server), stemming
(Lucene's Porter step; we only lower-case and drop Lucene's English stop words), comparison questions.

Run: `python envs.py searchqa --seed 0 --show`; `python -m agentic.searchqa --seeds 200` measures retrieval recall of
the gold passages, the scripted two-search policy and a one-search baseline; tests in tests/test_searchqa.py.
"""
from __future__ import annotations

import re
import string
from collections import Counter

import numpy as np

from .bm25 import BM25, tokenize  # noqa: F401  (re-exported: searchqa.BM25)
from env_base import Env, _int_opt, _prob_opt

# ---------------------------------------------------------------------------------------------- answer scoring
def normalize_answer(text: str) -> str:
    """SQuAD/HotpotQA normalisation: lower case, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 of the normalised strings; yes / no / noanswer score 0 unless both sides are equal."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in ("yes", "no", "noanswer") or ref in ("yes", "no", "noanswer")) and pred != ref:
        return 0.0
    common = sum((Counter(pred.split()) & Counter(ref.split())).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred.split()), common / len(ref.split())
    return 2 * precision * recall / (precision + recall)


def answer_reward(prediction: str, gold: str, f1_threshold: float = 0.3):
    """(reward, exact_match, f1): 1.0 on exact match, else f1 when f1 >= f1_threshold, else 0.0."""
    if normalize_answer(prediction) == normalize_answer(gold):
        return 1.0, True, 1.0
    f1 = f1_score(prediction, gold)
    return (f1 if f1 >= f1_threshold else 0.0), False, f1


def extract_answer(text: str) -> str:
    """The official fallback reading of an unformatted action: \\boxed{x}, then **bold**, then "the answer is
    x" / "therefore x", then the first sentence longer than 5 characters, else the first 100 characters."""
    text = " ".join(re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL).split())
    boxed = re.search(r"\\boxed\{([^}]+)\}", text)
    if boxed:
        return boxed.group(1).strip()
    for pattern in (r"\*\*([^*]+)\*\*", r"\*([^*]+)\*"):
        bold = [m.strip() for m in re.findall(pattern, text) if len(m.strip()) > 2 and re.search(r"\w", m)]
        if bold:
            return bold[0]
    for pattern in (r"(?:the\s+)?(?:correct\s+)?answer\s+is\s*:?\s*([^.!?]+)",
                    r"(?:therefore|thus|so|hence)\s*,?\s*([^.!?]+)"):
        m = re.search(pattern, text, re.IGNORECASE)
        if m and len(re.sub(r"^\W+|\W+$", "", m.group(1).strip())) > 3:
            return re.sub(r"^\W+|\W+$", "", m.group(1).strip())
    sentences = [s.strip() for s in re.split(r"[.!?]+", text) if len(s.strip()) > 5]
    return sentences[0] if sentences else text[:100].strip()


def format_results(hits, contents, max_doc_chars=800, max_total_chars=4000) -> str:
    """The official client's result block: numbered documents (the ID is the rank, as the official server's),
    each content cut to max_doc_chars + "...", the whole block to max_total_chars + "..."."""
    if not hits:
        return "No relevant documents found for the query."
    docs = []
    for rank, (i, score) in enumerate(hits, 1):
        text = contents[i] if len(contents[i]) <= max_doc_chars else contents[i][:max_doc_chars] + "..."
        docs.append(f"[Document {rank}] (ID: doc_{rank}, Score: {score:.3f})\n{text}")
    out = "\n\n".join(docs)
    return out if len(out) <= max_total_chars else out[:max_total_chars] + "..."


# --------------------------------------------------------------------------------------------- the world
FIRST = ("Tamsin Oriel Dagny Lucan Mireille Teodor Ysolde Casimir Wren Anselm Ilse Bastian Odile Ferris Liesl Marek "
         "Sabine Corin Nadia Evander Rosalind Joakim Thea Ambrose Dorian Greta Isidore Leona Matthias Ottilie Raffi "
         "Solveig Tobias Vesna Alaric Brigid Cyprian Elodie Gideon Maren").split()
LAST = ("Orlov Hallbrook Castellane Venn Marlowe Quill Ashdown Brandt Corvell Eskelund Fairweather Grimsby Holloway "
        "Ingram Jessop Kovacs Lindqvist Moravec Nyland Okafor Pellegrini Radley Sorensen Thorne Underhill Varga "
        "Whitlock Yardley Zeller Abernethy Blackwood Dunmore Ferrante Galloway Hartigan Kessler Lockhart Mercer "
        "Northcott Pryce").split()
TOWNS = ("Varnholm Kestrelby Ostmere Lindarrow Brackwater Tessaly Durnhollow Elvaston Falkreach Glenmarsh Harrowick "
         "Ivybridge Jorvale Kingsmere Larkhaven Mossgrove Northwick Oakhurst Pennrith Quarrendon Ravensholt "
         "Saltmarsh Thornbury Umberleigh Valdemoor Westerlin Yarrowby Zennor Ashcombe Brightwell Carrowmore "
         "Dunvegan Eastbrook Fernhallow Greystoke Hollowmere Inverkip Kirkwall Lowenstad Millbrae").split()
RIVERS = "Aldra Brennet Corrow Dessel Elwin Farrant Gaddon Hessel Isker Jorra Kelven Lusk Morrow Nessa Orvel".split()
OCCUPATIONS = ("sculptor cellist architect botanist photographer chemist cartographer playwright engineer "
               "astronomer potter violinist historian economist surgeon choreographer").split()
ORG_WORDS = ("Velmora Brightline Cobalt Driftwood Emberly Foxglove Goldmere Halcyon Ironvale Juniper Kingfisher "
             "Lodestar Meadowlark Northgate Oakleaf Pinecrest Quicksilver Redwing Silverbirch Tidewater").split()
ORG_KINDS = {"Records": "record label", "Press": "publishing house", "Studios": "animation studio",
             "Brewery": "brewery", "Labs": "research laboratory", "Theatre": "theatre company",
             "Works": "engineering firm"}
TITLE_ADJ = "Silent Hollow Crimson Last Northern Paper Glass Winter Quiet Burning Distant Broken Golden Salt".split()
TITLE_NOUN = "Harbor Orchard Lantern Meridian Garden Tide Archive Bridge Comet Fortress Atlas Voyage Mirror".split()
BOOK_GENRES = "mystery historical fantasy satirical epistolary crime".split()
FILM_GENRES = "documentary thriller comedy western musical drama".split()
ROLE = {"org": "founder", "book": "author", "film": "director"}      # the bridge's role in the question
# (hop-1 kind, attribute of the bridge): the bridge is a person, except for "river" (the organisation's town)
TEMPLATES = [(k, a) for k in ("org", "book", "film") for a in ("town", "year", "spouse")] + [("org", "river")]
QUESTION = {"town": "In which town was the {role} of {e} born?", "year": "In what year was the {role} of {e} born?",
            "spouse": "Who is married to the {role} of {e}?",
            "river": "On which river is the town where {e} is headquartered?"}


def _a(word: str) -> str:
    """'a sculptor', 'an architect'."""
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _pick(rng, pool, n=None):
    """n distinct items (or one item) of a pool, in rng order."""
    if n is None:
        return pool[int(rng.integers(len(pool)))]
    return [pool[int(i)] for i in rng.permutation(len(pool))[:n]]


def make_world(rng: np.random.Generator, num_works: int, num_towns: int) -> dict:
    """One instance: passages [(title, text)] (shuffled), the question, its answer, the gold hop queries and
    the gold passage indices. Distractors: the work paired with the gold one shares its title (novel vs film)
    or its first word (organisations) and was made by a person with the bridge's surname; another person
    shares the bridge's first name; towns mention each other."""
    kind, attr = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    towns = _pick(rng, TOWNS, num_towns)
    river = {t: _pick(rng, RIVERS) for t in towns}
    n_people = 3 * num_works                                         # one creator per work
    first, last = _pick(rng, FIRST), _pick(rng, LAST)
    names = [f"{first} {last}", f"{_pick(rng, [f for f in FIRST if f != first])} {last}",
             f"{first} {_pick(rng, [s for s in LAST if s != last])}"]      # bridge, same surname, same first name
    while len(names) < 2 * n_people:                                  # the second half: one spouse each
        name = f"{_pick(rng, FIRST)} {_pick(rng, LAST)}"
        if name not in names:
            names.append(name)
    people = names[:n_people]
    person = {p: dict(occ=_pick(rng, OCCUPATIONS), year=int(rng.integers(1920, 1976)), born=_pick(rng, towns),
                      lived=_pick(rng, towns), spouse=names[n_people + i]) for i, p in enumerate(people)}
    # works: slot 0 of `kind` is the gold one, slot 1 its look-alike partner (of `partner_kind`)
    adj, noun = _pick(rng, TITLE_ADJ, num_works), _pick(rng, TITLE_NOUN, num_works)
    titles = [f"The {a} {n}" for a, n in zip(adj, noun)]
    words, kinds = _pick(rng, ORG_WORDS, num_works), list(ORG_KINDS)
    works = {"book": list(titles), "film": [f"The {a} {n}" for a, n in zip(adj, noun[1:] + noun[:1])],
             "org": [f"{w} {_pick(rng, kinds)}" for w in words]}
    if kind == "org":
        partner_kind = "org"
        other = _pick(rng, [k for k in kinds if not works["org"][0].endswith(k)])
        works["org"][1] = f"{works['org'][0].split()[0]} {other}"    # same first word, other kind
    else:
        partner_kind = "film" if kind == "book" else "book"
        works[partner_kind][1] = works[kind][0]                       # same title, other medium
    slots = [(k, i) for k in ("org", "book", "film") for i in range(num_works)]
    rest = [s for s in slots if s not in ((kind, 0), (partner_kind, 1))]
    order = [(kind, 0), (partner_kind, 1)] + [rest[int(i)] for i in rng.permutation(len(rest))]
    creator = dict(zip(order, people))                                # bridge -> gold, namesake -> partner
    passages = []
    for k, i in slots:
        name, who = works[k][i], creator[(k, i)]
        year = person[who]["year"] + int(rng.integers(22, 46))          # made when its creator was 22-45
        if k == "org":
            hq = _pick(rng, towns)
            text = (f"{name} is {_a(ORG_KINDS[name.split()[-1]])} founded in {year} by {who}. "
                    f"It is headquartered in {hq}.")
        elif k == "book":
            text = (f"{name} is {_a(_pick(rng, BOOK_GENRES))} novel written by {who}. "
                    f"It was first published in {year}.")
        else:
            text = f"{name} is {_a(_pick(rng, FILM_GENRES))} film directed by {who}. It was released in {year}."
        passages.append((name, text))
    for p in people:
        f, since = person[p], person[p]["year"] + int(rng.integers(20, 40))
        passages.append((p, f"{p} is {_a(f['occ'])} born in {f['year']} in {f['born']}. {p.split()[1]} is married "
                            f"to {f['spouse']} and has lived in {f['lived']} since {since}."))
    for t in towns:
        passages.append((t, f"{t} is a town on the {river[t]} river, {int(rng.integers(5, 90))} kilometres from "
                            f"{_pick(rng, [u for u in towns if u != t])}. It has about "
                            f"{int(rng.integers(2, 90)) * 1000} inhabitants."))
    gold_work = works[kind][0]
    if attr == "river":
        bridge = re.search(r"headquartered in (\w+)\.", passages[slots.index((kind, 0))][1]).group(1)
        answer = river[bridge]
    else:
        bridge = creator[(kind, 0)]
        answer = {"town": person[bridge]["born"], "year": str(person[bridge]["year"]),
                  "spouse": person[bridge]["spouse"]}[attr]
    entity = gold_work if kind == "org" else f"the {'novel' if kind == 'book' else 'film'} {gold_work}"
    perm = [int(i) for i in rng.permutation(len(passages))]          # shuffled: no position leaks the gold
    gold = [slots.index((kind, 0)), next(i for i, p in enumerate(passages) if p[0] == bridge)]
    return dict(passages=[passages[i] for i in perm], gold=[perm.index(g) for g in gold], answer=answer,
                question=QUESTION[attr].format(role=ROLE[kind], e=entity), template=(kind, attr),
                queries=[gold_work if kind == "org" else f"{gold_work} {'novel' if kind == 'book' else 'film'}",
                         bridge])


# ------------------------------------------------------------------------------------------------ the env
ACTIONS_LINE = "Available actions: search[<query>], finish[<answer>]"
ACTION_RE = re.compile(r"(search|finish)\[(.*)\]", re.IGNORECASE | re.DOTALL)
FALLBACKS = ("answer", "invalid")    # unformatted text: graded as the final answer (official) | ignored
MAX_DRAWS = 100                      # instance re-draws until the question text alone misses the hop-2 passage


def parse_action(text: str):
    """("search" | "finish", argument) for `search[...]` / `finish[...]` (keyword case-insensitive), else None."""
    m = ACTION_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    return (m.group(1).lower(), m.group(2)) if m else None


class SearchQA(Env):
    """Answer a two-hop question by searching a per-instance knowledge base (official `search` env, offline)."""
    name = "searchqa"

    def __init__(self, top_k=5, max_doc_chars=800, max_total_chars=4000, max_steps=10, f1_threshold=0.3,
                 fallback="answer", num_works=4, num_towns=8,
                 max_turns=5, max_actions_per_turn=1, max_actions=10, max_tokens=300):
        """top_k, max_doc_chars, max_total_chars: the official result block (5 documents, 800 / 4000 chars);
        max_steps: the official env's step limit (a search at step max_steps ends the episode, reward 0);
        num_works: organisations, novels and films each (3 x num_works people, num_towns towns)."""
        super().__init__(max_turns, max_actions_per_turn, max_actions, max_tokens)
        self.top_k = _int_opt("top_k", top_k)
        self.max_doc_chars = _int_opt("max_doc_chars", max_doc_chars)
        self.max_total_chars = _int_opt("max_total_chars", max_total_chars)
        self.max_steps = _int_opt("max_steps", max_steps)
        self.f1_threshold = _prob_opt("f1_threshold", f1_threshold, lo_open=False)
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {list(FALLBACKS)}, got {fallback!r}")
        self.fallback = fallback
        self.num_works = _int_opt("num_works", num_works, lo=2)
        most = min(len(TITLE_ADJ), len(TITLE_NOUN), len(ORG_WORDS))
        if self.num_works > most:
            raise ValueError(f"num_works must be an integer in [2, {most}], got {num_works!r}")
        self.num_towns = _int_opt("num_towns", num_towns, lo=2)
        if self.num_towns > len(TOWNS):
            raise ValueError(f"num_towns must be an integer in [2, {len(TOWNS)}], got {num_towns!r}")
        # the official instruction, plus one line about the knowledge base (ours) and the fallback rule
        kb = ("The documents come from a small encyclopedia of fictional people, organisations, novels, films and "
              "towns: answer from what you find, not from memory.")
        if fallback == "answer":
            kb += " Any text that is not search[...] or finish[...] is read as your final answer."
        self.instructions = "\n".join([
            "You are a search agent answering questions by searching for information.",
            "Use search[your query] to find relevant documents, and finish[your answer] to submit your final answer.",
            kb,
            "",
            "You should first reason step-by-step about the current situation. This reasoning process MUST be "
            "enclosed within <think> </think> tags.",
            "Then provide your action within <answer>...</answer> tags.",
            "",
            "Examples:",
            "<think>I need to find information about Ben Platt's father.</think><answer>search[Ben Platt father "
            "parent]</answer>",
            "<think>Based on the search results, Ben Platt's father is Henry Platt.</think><answer>finish[Henry "
            "Platt]</answer>",
            self.protocol("search[your query]")])

    def _reset(self, seed):
        """Draw worlds from (seed, 0), (seed, 1), ... until searching the question text does not return the
        hop-2 passage in the top-k (so one search of the question cannot answer it)."""
        for draw in range(MAX_DRAWS):
            world = make_world(np.random.default_rng([seed, draw]), self.num_works, self.num_towns)
            contents = [f'"{title}"\n{text}' for title, text in world["passages"]]
            index = BM25(contents)
            if world["gold"][1] not in [i for i, _ in index.search(world["question"], self.top_k)]:
                break
        else:
            raise ValueError(f"seed {seed}: no instance in {MAX_DRAWS} draws keeps the hop-2 passage out of the "
                             f"question's top-{self.top_k}; lower top_k or raise num_works")
        self.world, self.contents, self.index, self.draws = world, contents, index, draw + 1
        self.question, self.answer = world["question"], world["answer"]
        self.solution = [f"search[{q}]" for q in world["queries"]] + [f"finish[{self.answer}]"]
        self.obs = f"Question: {self.question}\n{ACTIONS_LINE}"

    def step(self, action: str):
        """Env.step, plus the official fallback: non-empty text that is not search[...] / finish[...] is graded
        as the final answer and ends the episode, with info["valid"] = False (fallback="invalid": ignored)."""
        if self.seed is not None and not self.done and isinstance(action, str) and action.strip() \
                and parse_action(action) is None:
            if self.fallback == "invalid":
                return self.render(), 0.0, False, self._info(valid=False, effective=False)
            reward, extra = self._finish(extract_answer(action), "Your answer (extracted)")
            return self.render(), reward, True, self._info(valid=False, effective=True, action_type="fallback",
                                                           **extra)
        return super().step(action)

    def _step(self, action):
        kind, arg = parse_action(action)
        if kind == "finish":
            reward, extra = self._finish(arg, "Your answer")
            return reward, {"effective": True, "action_type": "finish", **extra}
        hits = self.index.search(arg, self.top_k)
        results = format_results(hits, self.contents, self.max_doc_chars, self.max_total_chars)
        self.done = self.num_actions + 1 >= self.max_steps               # official: forced end, no answer
        tail = "Maximum search steps reached. Episode ended without an answer." if self.done else ACTIONS_LINE
        self.obs = f"Search results for '{arg}':\n{results}\n\n{tail}"
        return 0.0, {"effective": True, "action_type": "search", "query": arg, "retrieved": [i for i, _ in hits]}

    def _finish(self, answer, label):
        """Grade an answer: the episode ends; success = exact match or a reward > 0 (official)."""
        reward, em, f1 = answer_reward(answer, self.answer, self.f1_threshold)
        self.done, self.success = True, em or reward > 0
        self.obs = f"{label}: {answer}. Reward: {reward:.2f}"
        return reward, {"answer": answer, "exact_match": em, "f1": f1}

    def render(self) -> str:
        return self.obs


# ------------------------------------------------------------------------------------- scripted policies
def _question_re(template):
    """A regex reading one QUESTION template back: groups role (if any) and e (the named entity)."""
    pattern = re.escape(template).replace(r"\{role\}", r"(?P<role>\w+)").replace(r"\{e\}", r"(?P<e>.+)")
    return re.compile(pattern + "$")


QUESTION_RE = {attr: _question_re(t) for attr, t in QUESTION.items()}
HOP1_RE = {"founder": r"founded in \d{4} by ([^.]+)\.", "author": r"written by ([^.]+)\.",
           "director": r"directed by ([^.]+)\.", "headquarters": r"headquartered in ([^.]+)\."}
HOP2_RE = {"town": r"born in \d{4} in ([^.]+)\.", "year": r"born in (\d{4})", "spouse": r"married to (.+?) and has",
           "river": r"on the (\S+) river"}
DOC_RE = re.compile(r'\[Document \d+\] \(ID: doc_\d+, Score: [-\d.]+\)\n"([^"\n]*)"\n([^\n]*)')


def read_documents(obs: str) -> list[tuple[str, str]]:
    """(title, text) of every document in a search observation, in rank order."""
    return DOC_RE.findall(obs)


def two_search_action(question: str, obs: str) -> str:
    """The scripted reader's next action, from the question and the current observation only: search the named
    work; in its results read the bridge off the document with exactly that title, and search the bridge; in
    those results read the answer off the bridge's document, and finish (finish[] when something is missing)."""
    attr, m = next((a, r.match(question)) for a, r in QUESTION_RE.items() if r.match(question))
    entity, medium = m["e"], None
    for prefix in ("the novel ", "the film "):
        if entity.startswith(prefix):
            entity, medium = entity[len(prefix):], prefix.split()[1]
    hop1_query = entity if medium is None else f"{entity} {medium}"
    if not obs.startswith("Search results for '"):
        return f"search[{hop1_query}]"
    docs = read_documents(obs)
    if obs.startswith(f"Search results for '{hop1_query}':"):
        hop1 = [t for title, t in docs if title == entity and (medium is None or f" {medium} " in t)]
        bridge = re.search(HOP1_RE["headquarters" if attr == "river" else m["role"]], hop1[0]) if hop1 else None
        return f"search[{bridge.group(1)}]" if bridge else "finish[]"
    bridge = obs[len("Search results for '"):obs.index("':\n")]
    hop2 = [t for title, t in docs if title == bridge]
    found = re.search(HOP2_RE[attr], hop2[0]) if hop2 else None
    return f"finish[{found.group(1) if found else ''}]"


def two_search_policy(env: SearchQA, seed: int):
    """Play one episode with two_search_action. Returns (episode return, success, actions)."""
    obs, done, ret, actions = env.reset(seed), False, 0.0, []
    question = obs.split("\n")[0][len("Question: "):]
    while not done and len(actions) < env.max_actions:
        actions.append(two_search_action(question, obs))
        obs, reward, done, info = env.step(actions[-1])
        ret += reward
    return ret, env.success, actions


def one_search_policy(env: SearchQA, seed: int):
    """Baseline showing that one search is not enough: search the question text, answer from the first
    document that states the asked attribute. Returns (episode return, success, actions)."""
    obs = env.reset(seed)
    question = obs.split("\n")[0][len("Question: "):]
    attr = next(a for a, r in QUESTION_RE.items() if r.match(question))
    docs = read_documents(env.step(f"search[{question}]")[0])
    found = [re.search(HOP2_RE[attr], t) for _, t in docs]
    answer = next((f.group(1) for f in found if f), "")
    _, reward, _, info = env.step(f"finish[{answer}]")
    return reward, info["success"], [f"search[{question}]", f"finish[{answer}]"]


def gold_ranks(env: SearchQA) -> list:
    """1-based rank of each gold passage among all passages for its gold query (None: score 0), current instance."""
    ranks = []
    for query, gold in zip(env.world["queries"], env.world["gold"]):
        order = [i for i, _ in env.index.search(query, len(env.contents))]
        ranks.append(order.index(gold) + 1 if gold in order else None)
    return ranks


if __name__ == "__main__":
    import argparse
    import time

    ap = argparse.ArgumentParser(description="Measure SearchQA-mini: gold-passage recall, scripted policies, speed.")
    ap.add_argument("--seeds", type=int, default=200, help="number of seeds, from --start")
    ap.add_argument("--start", type=int, default=10000, help="first seed (training seeds start at 10000)")
    a = ap.parse_args()
    env, seeds = SearchQA(), range(a.start, a.start + a.seeds)
    ranks, draws = [], []
    for s in seeds:
        env.reset(s)
        ranks.append(gold_ranks(env))
        draws.append(env.draws)
    for hop in (0, 1):
        r = [x[hop] for x in ranks]
        print(f"hop {hop + 1} gold query: recall@1 {np.mean([x == 1 for x in r]):.3f}, "
              f"recall@{env.top_k} {np.mean([x is not None and x <= env.top_k for x in r]):.3f}")
    q_hits = []
    for s in seeds:
        env.reset(s)
        q_hits.append(env.world["gold"][0] in [i for i, _ in env.index.search(env.question, env.top_k)])
    print(f"question text as the query: hop-1 passage in the top {env.top_k} {np.mean(q_hits):.3f} "
          "(hop-2 passage: never, by construction)")
    print(f"passages per instance: {len(env.contents)}; mean draws per instance {np.mean(draws):.2f}")
    for name, pol in (("two-search scripted", two_search_policy), ("one-search baseline", one_search_policy)):
        out = [pol(env, s) for s in seeds]
        print(f"{name}: success {np.mean([o[1] for o in out]):.3f}, mean return {np.mean([o[0] for o in out]):.3f}")
    t_reset = t_step = 0.0
    for s in seeds:
        t0 = time.perf_counter()
        env.reset(s)
        t1 = time.perf_counter()
        env.step(env.solution[0])
        t_reset, t_step = t_reset + t1 - t0, t_step + time.perf_counter() - t1
    print(f"reset {1e3 * t_reset / len(seeds):.2f} ms; search step {1e3 * t_step / len(seeds):.3f} ms")
