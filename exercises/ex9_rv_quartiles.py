"""Exercise 9 (paper §3.3, v1 Table 6): train on one reward-variance quartile only (toy bandit, exact gradients).

The paper trains Sokoban on the top RV quartile (Q1) or the bottom one (Q4) of each batch and reports that Q1
learns better and keeps more I(X;Z). theory/filter_bandit.py runs the same ablation on a toy contextual bandit
(a linear softmax policy, group-mean REINFORCE, entropy coefficient 0.2) where every quantity is exact.

1. Predict: which quartile ends with the higher success, and which with the higher I(X;Z)? By how much?
2. Run: `python theory/filter_bandit.py --size small` (seconds) and copy from the rows "[lam_ent=0.2] Q1 only"
   and "[lam_ent=0.2] Q4 only" the success (first number) and I (third number), means over seeds.
3. Explain: why does training only on Q4 hurt, given what the task gradient of a low-RV prompt is (exercise 7)
   and what the entropy term does to it?

Grade: python exercises/check.py 9
"""

ANSWERS = {
    "prediction": "",
    "success_Q1": None,
    "success_Q4": None,
    "I_Q1": None,
    "I_Q4": None,
    "explanation": "",
}
