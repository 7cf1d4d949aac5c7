"""Exercise 10 (paper §3, Thm H.3; the FrozenLake slip sweep): when does high RV mean high SNR?

The SNR bound says SNR(x) <= sqrt(G) sqrt(RV(x)) / sigma(x): reward variance is signal only when the noise sigma
is the same for every prompt. In FrozenLake with slipping, some prompts are noisier than others; the paper's own
slip sweep finds filtering helps less there. theory/snr_bound.py measures Spearman(RV, SNR) over many toy prompts
with homogeneous noise and with heterogeneous noise.

1. Predict the sign and rough size of Spearman(RV, SNR) in both cases.
2. Run: `python theory/snr_bound.py --size small` and copy the two "Spearman(RV, SNR)" numbers.
3. Explain: with heterogeneous noise, what does ranking prompts by RV select, and what does that predict for
   SNR-Aware Filtering on a slippery lake?

Grade: python exercises/check.py 10
"""

ANSWERS = {
    "prediction": "",
    "spearman_homogeneous": None,
    "spearman_heterogeneous": None,
    "explanation": "",
}
