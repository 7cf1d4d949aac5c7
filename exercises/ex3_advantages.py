"""Exercise 3 (paper §2.1, §4.1): GRPO and Dr.GRPO group-relative advantages.

For a group of G rewards R[p, :] of one prompt:
    GRPO:     A[p, g] = (R[p, g] - mean_g R[p, :]) / (std_g R[p, :] + 1e-6)    with the UNBIASED std (G - 1)
    Dr.GRPO:  A[p, g] =  R[p, g] - mean_g R[p, :]
(G >= 2 in this exercise.) Question to answer for yourself: what is A for a group whose rewards are all equal,
and what does that mean for the task gradient of that prompt (paper §3.2)?

Grade: python exercises/check.py 3
"""


def group_advantages(R, normalize_std=True):
    """R: P x G nested list of rewards. Return a P x G nested list of advantages (GRPO if normalize_std, else
    Dr.GRPO)."""
    raise NotImplementedError("exercise 3: subtract the group mean, and divide by std + 1e-6 for GRPO")
