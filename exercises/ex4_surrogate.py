"""Exercise 4 (paper §2.1, App. B): the PPO clipped surrogate with clip-higher and dual clip, per token.

    ratio = exp(logp - old_logp)
    L1 = -A * ratio
    L2 = -A * clip(ratio, 1 - clip_low, 1 + clip_high)          (clip-higher: two different bounds)
    L  = max(L1, L2)                                            (the pessimistic bound)
    dual clip, ONLY where A < 0:  L = min(L, -A * clip_c)       (caps the loss when the ratio runs past clip_c)

Grade: python exercises/check.py 4
"""


def clipped_surrogate(logp, old_logp, adv, clip_low=0.2, clip_high=0.28, clip_c=3.0):
    """All inputs are lists of floats of one length (tokens). Return the per-token loss as a list of floats."""
    raise NotImplementedError("exercise 4: ratio, the two clipped losses, their max, then the dual clip for A < 0")
