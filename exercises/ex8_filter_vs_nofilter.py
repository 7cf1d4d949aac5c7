"""Exercise 8 (paper §4; the referee's controls): filter vs no filter vs the dilution control on SmolLM2.

1. Predict (before looking): read experiments/classroom.md up to "Per arm". The paper says top-p 0.9 beats no
   filter. In this setting (deterministic Bandit, lr 5e-5, a policy whose token entropy falls below 0.1 within
   a few steps), which arm will have the highest final validation success, and why? Write it into "prediction".
2. Read: open experiments/RESULTS.md (or regenerate it: the command is on the page) and copy, as numbers:
   the mean final validation success of each arm (`final` column), the filter arm's mean kept fraction
   (`filter/kept_frac@mean`) and its mean number of zero-RV groups per step (`filter/zero_rv_count@mean`, of 4).
   From "Verdicts by fixed rules": is ANY paired difference of final success resolved? (True / False)
3. Explain. "mechanism": the letter of the reading the numbers support:
     (a) Filtering removes the entropy bonus of the zero-RV groups, and the dilution control shows that this
         removal alone explains the filter arm's gain.
     (b) Once the policy is nearly deterministic per prompt most groups have RV 0, so the filter keeps few
         groups (whole steps are skipped) and an all-wrong group never re-enters the update; without the
         filter such a group still gets the entropy bonus, but at coefficient 0.001 that force is small,
         consistent with the three arms not separating.
     (c) The filter arm ends highest because it trains only on the high-SNR groups, as the paper predicts.
     (d) Template collapse (MI falls while the entropy stays level) hits the no-filter arm, and the filter
         prevents it.
   Then, in your own words (two or three sentences, into "explanation"): what does the filter do on a step where
   every group has RV 0, what does the no-filter arm still do on such a step, and why could you not rule out (a)
   or (c) without the other two arms? The explanation is read in class; the grader only checks it is written out.
Optional: rerun one seed yourself (`python experiments/paper.py classroom --seeds 0 --out-dir runs/mine --page
runs/mine/RESULTS.md`, ~30 min) and compare.

Grade: python exercises/check.py 8   (numbers within 0.01 of the committed runs; True/False and the letter exact)
"""

ANSWERS = {
    "prediction": "",
    "final_filter": None,
    "final_nofilter": None,
    "final_nofilter_diluted": None,
    "kept_frac_filter": None,
    "zero_rv_groups_filter": None,
    "any_difference_resolved": None,     # True or False
    "mechanism": "",                     # "a", "b", "c" or "d"
    "explanation": "",
}
