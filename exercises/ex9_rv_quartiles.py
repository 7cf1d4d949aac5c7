"""Exercise 9 (paper §3.3, v1 Table 6): train on one reward-variance quartile only (toy bandit, exact gradients).

The paper trains Sokoban on the top RV quartile (Q1) or the bottom one (Q4) of each batch and reports that Q1
learns better and keeps more I(X;Z). theory/filter_bandit.py runs the same ablation on a toy contextual bandit
(a linear softmax policy, group-mean REINFORCE, entropy coefficient 0.2) where every quantity is exact.

1. Predict: which quartile ends with the higher success, and which with the higher I(X;Z)? By how much?
2. Run: `python theory/filter_bandit.py --size small` (seconds) and copy from the rows "[lam_ent=0.2] Q1 only"
   and "[lam_ent=0.2] Q4 only" the success (first number) and I (third number), means over seeds. Then name the
   quartile ("Q1" or "Q4") with the higher success and the one with the higher I(X;Z).
3. Explain. "mechanism": the letter of the reason Q4-only training hurts:
     (a) Q4 groups have RV about 0, so their task gradient is about 0 (exercise 7: ||g|| <= sqrt(RV)
         sqrt(E||s||^2)); the update is then almost only the entropy gradient, which pushes every prompt's
         policy toward uniform, eroding I(X;Z) and success.
     (b) Q4 prompts are the hard ones, and hard prompts give large gradients that overshoot.
     (c) The Q4 arm updates on fewer prompts per step than the Q1 arm.
     (d) The Q4 arm trains without the entropy bonus, so its policy collapses onto one action.
   Then, in two or three sentences ("explanation"): which number in the output rules out (c), and what would
   you expect with entropy coefficient 0 (try `theory/filter_bandit.py` with your own arguments in Python)?

Grade: python exercises/check.py 9
"""

ANSWERS = {
    "prediction": "",
    "success_Q1": None,
    "success_Q4": None,
    "I_Q1": None,
    "I_Q4": None,
    "higher_success": "",     # "Q1" or "Q4"
    "higher_I": "",           # "Q1" or "Q4"
    "mechanism": "",          # "a", "b", "c" or "d"
    "explanation": "",
}
