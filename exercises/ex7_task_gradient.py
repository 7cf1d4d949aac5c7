"""Exercise 7 (paper §3, Thm H.2 / "Theorem G.1"): the task gradient and its sqrt(RV) bound on a toy policy.

One prompt, a softmax policy over K outcomes with logits theta: pi = softmax(theta); outcome z earns reward r[z].
The task gradient with respect to the logits is  g = grad_theta E_pi[r] = pi * (r - E_pi[r])   (elementwise).
The score of outcome z is s(z) = grad_theta log pi(z) = e_z - pi, and  E_pi ||s||^2 = 1 - ||pi||^2.
Theorem: ||g|| <= sqrt(RV) * sqrt(E||s||^2),  with RV = Var_pi(r).  (Why: g = E[(r - E r) s], Cauchy-Schwarz.)

Implement the three quantities. A prompt whose rewards do not vary (RV = 0) then has no task gradient at all.

Grade: python exercises/check.py 7
"""


def task_gradient(pi, r):
    """pi: K probabilities; r: K rewards. Return g as a list of K floats."""
    raise NotImplementedError("exercise 7a: pi * (r - E_pi r)")


def reward_variance(pi, r):
    """Return Var_pi(r) as a float."""
    raise NotImplementedError("exercise 7b")


def expected_sq_score(pi):
    """Return E_pi ||e_z - pi||^2 as a float."""
    raise NotImplementedError("exercise 7c")
