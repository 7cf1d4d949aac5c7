"""Exercise 2 (paper §3.3, App. G): the linear top-p rule of SNR-Aware Filtering, with its slack.

Given the reward variance rv[i] of every group, keep the groups with the largest RV until their cumulative RV
reaches tau = rho * (sum of the candidates' rv) - eps   (0 < rho <= 1, eps >= 0):
  * groups with rv <= 1e-10 are never candidates (they carry no task gradient), whatever rho is;
  * rank the candidates by rv, largest first; ties keep the lower group index first;
  * keep the smallest prefix of that ranking whose mass reaches tau (the mass accumulated BEFORE adding a group
    is compared with tau: you stop as soon as the kept mass is >= tau);
  * if even all candidates do not reach tau, keep nothing (the step is skipped). Note what that means when
    tau <= 0, and when there is no candidate at all.

Grade: python exercises/check.py 2      (worked example: `python filter.py 0.25 0.24 0.1 0.05 0 0 0 0`)
"""


def top_p_keep(rv, rho=0.9, eps=0.0):
    """rv: list of P non-negative floats. Return the kept group indices (original positions in rv) as a sorted
    list of ints."""
    raise NotImplementedError("exercise 2: walk the RV ranking until the kept mass reaches rho * sum - eps")
