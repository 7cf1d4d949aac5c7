"""Exercise 8 (paper §4; the referee's controls): filter vs no filter vs the dilution control on SmolLM2.

1. Predict (before looking): read experiments/classroom.md up to "Per arm". The paper says top-p 0.9 beats no
   filter. In this setting (deterministic Bandit, lr 5e-5, a policy whose token entropy falls below 0.1 within
   a few steps), which arm will have the highest final validation success, and why? Write it into "prediction".
2. Read: open experiments/RESULTS.md (or regenerate it: the command is on the page) and copy, as numbers:
   the mean final validation success of each arm (`final` column), and the filter arm's mean kept fraction
   (`filter/kept_frac@mean`).
3. Explain (two or three sentences, into "explanation"): which diagnostic on the page explains the difference
   between the filter arm and the other two? Hint: what does the filter do on a step where every group has RV 0,
   and what does the no-filter arm still do on such a step?
Optional: rerun one seed yourself (`python experiments/paper.py classroom --seeds 0 --out-dir runs/mine --page
runs/mine/RESULTS.md`, ~30 min) and compare.

Grade: python exercises/check.py 8   (numbers within 0.01 of the committed runs)
"""

ANSWERS = {
    "prediction": "",
    "final_filter": None,
    "final_nofilter": None,
    "final_nofilter_diluted": None,
    "kept_frac_filter": None,
    "explanation": "",
}
