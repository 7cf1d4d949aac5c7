"""Exercise 10 (paper §3, Thm H.3; the FrozenLake slip sweep): when does high RV mean high SNR?

The SNR bound says SNR(x) <= sqrt(G) sqrt(RV(x)) / sigma(x): reward variance is signal only when the noise sigma
is the same for every prompt. In FrozenLake with slipping, some prompts are noisier than others; the paper's own
slip sweep finds filtering helps less there. theory/snr_bound.py measures Spearman(RV, SNR) over many toy prompts
with homogeneous noise and with heterogeneous noise.

1. Predict the sign and rough size of Spearman(RV, SNR) in both cases.
2. Run: `python theory/snr_bound.py --size small` and copy the two "Spearman(RV, SNR)" numbers.
3. Explain. "rv_selects_heterogeneous": with heterogeneous noise, ranking prompts by RV and keeping the top
   selects (the letter)
     (a) the prompts with the highest SNR
     (b) the noisiest prompts (RV = Var(mu) + sigma^2 grows with the noise)
     (c) a random subset: RV is unrelated to SNR and to the noise
   "slippery_lake": and so, for SNR-Aware Filtering on a slippery FrozenLake (the letter)
     (a) filtering should help more on a slippery lake than on a deterministic one
     (b) filtering should help less on a slippery lake (it keeps the noisy prompts), as the paper's slip sweep
         finds
     (c) the bound says nothing about a slippery lake
   Then, in two or three sentences ("explanation"): which other number in the output supports your letter, and
   what statistic would rank prompts by signal even with heterogeneous noise?

Grade: python exercises/check.py 10
"""

ANSWERS = {
    "prediction": "",
    "spearman_homogeneous": None,
    "spearman_heterogeneous": None,
    "rv_selects_heterogeneous": "",    # "a", "b" or "c"
    "slippery_lake": "",               # "a", "b" or "c"
    "explanation": "",
}
