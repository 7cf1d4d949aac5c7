"""Exercise 11 (paper §2, §2.3, Fig. 1): watch the collapse diagnostic on the real model (SmolLM2-135M).

Four prompts (FACTS below, each asked as "Remember: <fact>. What do you know?"), two reasonings per prompt. The
diagnostic scores every reasoning under every prompt with the model (L[i][j] = log q(z_i | x_j), teacher
forcing), then reports MI-Seq-Est (<= log 4 = 1.39 nats), retrieval accuracy (chance 0.25), the permutation null
of MI, and H(Z|X) est. = -mean log q(z_i | x_i) per token (how surprising the reasoning is under its own prompt).

1. Predict (before running), into "prediction": for a set of reasonings that restate their own prompt's fact,
   and for a set where every prompt gets the same template text ("Let me think step by step about this."),
   roughly what MI-Seq-Est, retrieval accuracy and H(Z|X) est. will be, and which one has the higher H(Z|X).
2. Write your own sets into REASONINGS (8 strings each, in prompt order: entries 0-1 answer FACTS[0], 2-3
   FACTS[1], ...): "healthy" reasonings that depend on their prompt (in your words, not a copy of the example),
   and "templated" ones that ignore it (one text or several; varied wording is allowed). Then run
   `python exercises/ex11_collapse_diagnostic.py` (about a minute on a 2-core CPU) and copy the numbers it
   prints into ANSWERS.
3. Place the templated set on the regime map (I(X;Z) up, H(Z|X) across; paper Fig. 1,
   theory/figures/entropy_regimes.png). "regime_templated", the letter:
     (a) diverse: high I(X;Z), high H(Z|X)
     (b) template collapse: I(X;Z) near 0 while H(Z|X) stays up
     (c) compressed: high I(X;Z), low H(Z|X)
     (d) low-entropy collapse: I(X;Z) near 0 and H(Z|X) low
   "entropy_sees_it": True if H(Z|X) est. alone ranks your templated set as the collapsed one (lower H(Z|X) than
   the healthy set), else False.
   Explanation (two or three sentences): what would the training logs have to show for you to call a run
   template-collapsed, and why is the token entropy not enough?

The grader rescores your sets with SmolLM2: the healthy set must be retrieved (retrieval >= 0.75, MI-Seq-Est
above its permutation null by z > 2) and the templated one must not (MI-Seq-Est <= 0.1 log 4, retrieval <= 0.5);
the copied numbers must match within 0.02; the letter and the True/False are checked against your own numbers.

Grade: python exercises/check.py 11   (needs the embedded SmolLM2 wheel; about a minute)
"""

FACTS = ["the red key opens the north door", "the box must go two steps left",
         "the lake has a hole at row three", "the answer is the number forty two"]

REASONINGS = {
    "healthy": [],        # 8 strings: two per fact, in FACTS order
    "templated": [],      # 8 strings that ignore the prompt
}

ANSWERS = {
    "prediction": "",
    "mi_healthy": None,             # MI-Seq-Est of your healthy set
    "retrieval_healthy": None,
    "H_healthy": None,              # H(Z|X) est. (per token)
    "mi_templated": None,
    "retrieval_templated": None,
    "H_templated": None,
    "regime_templated": "",         # "a", "b", "c" or "d"
    "entropy_sees_it": None,        # True or False
    "explanation": "",
}

if __name__ == "__main__":
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import check
    for name, texts in REASONINGS.items():
        try:
            m = check.score_reasonings(tuple(texts))
        except check.Fail as err:
            print(f"{name}: {err}")
            continue
        print(f"{name:9s}  MI-Seq-Est {m['mi']:.3f} (null z {m['null_z']:.2f})   retrieval {m['retrieval']:.3f}   "
              f"H(Z|X) est. {m['H']:.3f} nats/token")
