"""Exercise 6 (paper §2.1, App. B; PPO): generalised advantage estimation over a multi-turn token sequence.

A multi-turn trajectory is one token sequence in which the model's generated tokens (mask = 1) alternate with
observation tokens from the environment (mask = 0). GAE runs backwards over the positions t = T-1 ... 0:
    values are first multiplied by the mask;
    delta_t = r_t + gamma * V_next - V_t,     A_t = delta_t + gamma * lam * A_next
    on generated tokens (mask = 1): afterwards V_next <- V_t and A_next <- A_t
    on observation / padding tokens (mask = 0): A_t = 0 and V_next, A_next are carried through UNCHANGED
(V_next = A_next = 0 after the last position.) So an observation between two turns is skipped: the advantage of a
generated token is ordinary GAE over the sequence of generated tokens only. No whitening in this exercise.

Grade: python exercises/check.py 6
"""


def gae(rewards, values, mask, gamma=1.0, lam=1.0):
    """rewards, values, mask: lists of T floats (mask entries 0 or 1) of ONE sequence. Return the advantages
    (list of T floats, 0 where mask = 0)."""
    raise NotImplementedError("exercise 6: one backward loop, skipping positions where mask == 0")
