"""Numerical checks of the RAGEN-2 gradient-SNR theory on toy softmax policies (RAGEN-2, arXiv 2604.06268, §3 and
App. E-N).

`toy.py` holds the exact tools (information quantities, scores, exact gradients, group estimators, the top-p
mass rule); each check E1-E8 is one script named by content; `run_all.py` regenerates `RESULTS.md`.
Run one check with `python theory/<name>.py`, all of them with `python theory/run_all.py`.
"""
