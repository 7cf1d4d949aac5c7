"""Exercise 1 (paper §3.3, eq. for RV): the reward variance of each prompt group.

RV(x) is the variance of the G rewards a prompt x received in one step. SNR-Aware Filtering ranks groups by it.
Implement it as the *unbiased* sample variance (divide by G - 1), as the paper and filter.py do.

Grade: python exercises/check.py 1
"""


def reward_variance(R):
    """R: a P x G nested list (or array) of rewards, one row per prompt group.
    Return a list of P floats: the unbiased variance of each row."""
    raise NotImplementedError("exercise 1: compute the unbiased variance of every row of R")
