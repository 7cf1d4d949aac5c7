"""Tests of algos.py: every function against an independent computation (plain Python loops or numpy,
never the same vectorised formula), worked examples, clip boundaries and gradients."""
import math
import statistics

import numpy as np
import pytest
import torch

import algos

# Ragged masks: row 0 has an observation gap (two turns), row 1 is short, row 2 is empty, row 3 is full.
MASK = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0],
                     [0, 0, 1, 1, 1, 0, 0, 0],
                     [0, 0, 0, 0, 0, 0, 0, 0],
                     [1, 1, 1, 1, 1, 1, 1, 1]])


def rows(mask):
    """Per row, the list of positions where mask is 1 (plain Python)."""
    return [[t for t in range(mask.shape[1]) if mask[b, t]] for b in range(mask.shape[0])]


# ----------------------------------------------------------------------------------- GRPO advantages
@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_advantages_match_loop(normalize_std):
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 4, (5, 6), generator=g).double() * 0.5
    rewards[2] = 1.5  # a zero-variance group
    adv = algos.grpo_advantages(rewards, normalize_std=normalize_std, eps=1e-6)
    for p in range(5):
        r = rewards[p].tolist()
        mu, sd = statistics.mean(r), statistics.stdev(r)  # stdev = unbiased (G - 1)
        for g_ in range(6):
            want = (r[g_] - mu) / (sd + 1e-6) if normalize_std else r[g_] - mu
            assert adv[p, g_].item() == pytest.approx(want, abs=1e-12)
    assert torch.all(adv[2] == 0)  # zero-variance group: no task signal at all
    assert adv.sum(dim=1).abs().max() < 1e-9  # group-relative: zero mean in every group


def test_grpo_worked_example_and_size_one_groups():
    adv = algos.grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), eps=0.0)
    # mean 0.25, unbiased std sqrt(0.75/3) = 0.5
    assert torch.allclose(adv, torch.tensor([[1.5, -0.5, -0.5, -0.5]]))
    single = torch.tensor([[2.0], [-1.0]])  # groups of size 1: mean 0, std 1 (verl)
    assert torch.allclose(algos.grpo_advantages(single, eps=1e-6), single / (1 + 1e-6))
    assert torch.equal(algos.grpo_advantages(single, normalize_std=False), single)


def test_grpo_bad_input():
    with pytest.raises(ValueError, match="rewards"):
        algos.grpo_advantages(torch.zeros(8))
    with pytest.raises(ValueError, match="eps"):
        algos.grpo_advantages(torch.zeros(2, 2), eps=-1.0)


def test_token_advantages_and_terminal_rewards():
    mask = MASK[[0, 1, 3]]
    adv = torch.tensor([0.5, -2.0, 1.0])
    tok = algos.token_advantages(adv, mask)
    for b, pos in enumerate(rows(mask)):
        for t in range(8):
            assert tok[b, t].item() == (adv[b].item() if t in pos else 0.0)
    r = algos.terminal_token_rewards(torch.tensor([3.0, -1.0, 7.0]), mask)
    want = torch.zeros(3, 8)
    want[0, 6], want[1, 4], want[2, 7] = 3.0, -1.0, 7.0  # last generated token of each row
    assert torch.equal(r, want)
    with pytest.raises(ValueError, match="without generated tokens"):
        algos.terminal_token_rewards(torch.ones(4), MASK)


# ----------------------------------------------------------------------------------- whitening and GAE
def test_whiten_matches_numpy():
    x = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = algos.whiten(x, MASK)
    sel = x.numpy()[MASK.numpy() == 1]
    mu, var = sel.mean(), sel.var(ddof=1)  # Bessel-corrected, over masked entries only
    want = (x.numpy() - mu) / np.sqrt(var + 1e-8)  # every entry transformed, mean not added back
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12)
    w = out.numpy()[MASK.numpy() == 1]
    assert abs(w.mean()) < 1e-12 and w.std(ddof=1) == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        algos.whiten(x, torch.zeros_like(MASK).index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(1)))


def gae_reference(rewards, values, mask, gamma, lam):
    """Independent GAE: per row, compact the generated positions and run textbook GAE on them."""
    B, T = rewards.shape
    adv = np.zeros((B, T))
    for b in range(B):
        pos = [t for t in range(T) if mask[b, t]]
        a_next, v_next = 0.0, 0.0
        for t in reversed(pos):
            delta = rewards[b, t] + gamma * v_next - values[b, t]
            a_next = delta + gamma * lam * a_next
            v_next = values[b, t]
            adv[b, t] = a_next
        # non-generated positions carry the advantage of the next generated token (0 after the last)
        carry = 0.0
        for t in reversed(range(T)):
            if mask[b, t]:
                carry = adv[b, t]
            else:
                adv[b, t] = carry
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.8), (0.5, 0.0)])
def test_gae_with_observation_gaps(gamma, lam):
    mask = MASK[[0, 1, 3]]
    gen = torch.Generator().manual_seed(2)
    rewards = torch.randn(3, 8, generator=gen, dtype=torch.float64) * mask  # rewards on generated tokens
    values = torch.randn(3, 8, generator=gen, dtype=torch.float64)  # garbage off-mask must not matter
    adv, ret = algos.gae_advantages(rewards, values, mask, gamma, lam, whiten_adv=False)
    want = gae_reference(rewards.numpy(), values.numpy(), mask.numpy(), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), want, atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), want + (values * mask).numpy(), atol=1e-12)
    adv_w, ret_w = algos.gae_advantages(rewards, values, mask, gamma, lam)  # default: whitened
    np.testing.assert_allclose(adv_w.numpy(), algos.whiten(adv, mask).numpy(), atol=1e-12)
    assert torch.equal(ret_w, ret)  # returns are taken before whitening


def test_gae_terminal_reward_worked_example():
    # gamma = lam = 1, one terminal reward R: A_t = R - V_t and returns R on every generated token.
    mask = MASK[[0, 1]]
    R = torch.tensor([10.0, -1.0])
    values = torch.tensor([[9, 1, 2, 9, 9, 3, 4, 9], [9, 9, 5, 6, 7, 9, 9, 9]], dtype=torch.float32)
    adv, ret = algos.gae_advantages(algos.terminal_token_rewards(R, mask), values, mask, whiten_adv=False)
    for b, pos in enumerate(rows(mask)):
        for t in pos:
            assert adv[b, t].item() == pytest.approx(R[b].item() - values[b, t].item())
            assert ret[b, t].item() == pytest.approx(R[b].item())
    with pytest.raises(ValueError, match="gamma"):
        algos.gae_advantages(torch.zeros(2, 8), values, mask, gamma=1.5)


# ----------------------------------------------------------------------------------- aggregation
def agg_reference(x, mask, mode, C=None):
    """Plain-loop loss aggregation."""
    num = den = 0.0
    seqs = []
    for b, pos in enumerate(rows(mask)):
        for t in pos:
            num += x[b][t]
            den += 1
        if pos:
            s = sum(x[b][t] for t in pos)
            seqs.append({"seq-mean-token-mean": s / len(pos), "seq-mean-token-sum": s,
                         "seq-mean-token-sum-norm": s / (C or 1)}.get(mode, 0.0))
    if mode == "token-mean":
        return num / den
    return sum(seqs) / len(seqs)


@pytest.mark.parametrize("mode", algos.AGG_MODES)
def test_agg_loss_modes_on_ragged_masks(mode):
    x = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    x_dirty = x.clone()
    x_dirty[MASK == 0] = float("nan")  # padding garbage must not leak into any mode
    got = algos.agg_loss(x_dirty, MASK, mode, norm_len=16)
    assert got.item() == pytest.approx(agg_reference(x.tolist(), MASK, mode, C=16), abs=1e-12)


def test_agg_loss_token_weights_by_gradient():
    # d agg / d x[b, t] is the weight of each token: 1/N, 1/(B' n_b), 1/B', 1/(B' C).
    n = [len(p) for p in rows(MASK)]  # [4, 3, 0, 8]
    N, Bp = sum(n), 3
    weights = {"token-mean": lambda b: 1 / N, "seq-mean-token-mean": lambda b: 1 / (Bp * n[b]),
               "seq-mean-token-sum": lambda b: 1 / Bp, "seq-mean-token-sum-norm": lambda b: 1 / (Bp * 10)}
    for mode, w in weights.items():
        x = torch.zeros(4, 8, dtype=torch.float64, requires_grad=True)
        algos.agg_loss(x, MASK, mode, norm_len=10).backward()
        for b, pos in enumerate(rows(MASK)):
            for t in range(8):
                assert x.grad[b, t].item() == pytest.approx(w(b) if t in pos else 0.0, abs=1e-15)


def test_agg_loss_edge_cases():
    x = torch.ones(2, 3, requires_grad=True)
    empty = algos.agg_loss(x, torch.zeros(2, 3), "seq-mean-token-mean")
    assert empty.item() == 0.0 and empty.requires_grad  # nothing to learn from, still differentiable
    with pytest.raises(ValueError, match="norm_len"):
        algos.agg_loss(x, torch.ones(2, 3), "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="token-mean"):
        algos.agg_loss(x, torch.ones(2, 3), "seq-sum")
    with pytest.raises(ValueError, match="shape"):
        algos.agg_loss(x, torch.ones(3, 2), "token-mean")


# ----------------------------------------------------------------------------------- policy loss
EL, EH, C = 0.2, 0.28, 3.0


def surrogate_reference(r, A, el=EL, eh=EH, c=C):
    """Case form of the clipped surrogate, written independently of the max/min formula."""
    if A >= 0:
        return -A * min(r, 1 + eh)  # a good token gains nothing above 1 + eps_high
    loss = abs(A) * max(r, 1 - el)  # a bad token gains nothing below 1 - eps_low
    return min(loss, abs(A) * c) if c is not None else loss  # dual clip caps the loss at |A| c


D = 1e-3  # just inside / just outside each boundary
RATIOS = [1.0, 1 - EL + D, 1 - EL - D, 1 + EH - D, 1 + EH + D, 0.5, 2.0, C - D, C + D, 10.0]


@pytest.mark.parametrize("clip_c", [3.0, None])
def test_clipped_surrogate_boundaries_values_and_gradients(clip_c):
    ratios = torch.tensor(RATIOS * 2, dtype=torch.float64)
    A = torch.tensor([1.5] * len(RATIOS) + [-0.7] * len(RATIOS), dtype=torch.float64)
    old = torch.randn(len(ratios), dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    logp = (old + torch.log(ratios)).requires_grad_(True)
    loss = algos.clipped_surrogate(logp[None], old[None], A[None], EL, EH, clip_c)[0]
    loss.sum().backward()
    for i, (r, a) in enumerate(zip(ratios.tolist(), A.tolist())):
        assert loss[i].item() == pytest.approx(surrogate_reference(r, a, c=clip_c), abs=1e-12)
        # gradient w.r.t. logp: -A r where the ratio is live, 0 where a clip holds it
        live = (r < 1 + EH) if a > 0 else (r > 1 - EL and (clip_c is None or r < clip_c))
        assert logp.grad[i].item() == pytest.approx(-a * r if live else 0.0, abs=1e-12)


def test_policy_loss_aggregates_and_broadcasts():
    g = torch.Generator().manual_seed(5)
    logp, old = torch.randn(4, 8, generator=g) * 0.3, torch.randn(4, 8, generator=g) * 0.3
    adv = torch.tensor([1.0, -2.0, 0.5, -0.1])
    for mode in algos.AGG_MODES:
        got = algos.policy_loss(logp, old, adv, MASK, EL, EH, mode, norm_len=8)
        per = [[surrogate_reference(math.exp(logp[b, t] - old[b, t]), adv[b].item()) for t in range(8)]
               for b in range(4)]
        assert got.item() == pytest.approx(agg_reference(per, MASK, mode, C=8), abs=1e-5)
        tok = algos.policy_loss(logp, old, algos.token_advantages(adv, MASK), MASK, EL, EH, mode, norm_len=8)
        assert torch.allclose(got, tok)
    with pytest.raises(ValueError, match="clip_c"):
        algos.policy_loss(logp, old, adv, MASK, EL, EH, "token-mean", clip_c=1.0)
    with pytest.raises(ValueError, match="clip_low"):
        algos.policy_loss(logp, old, adv, MASK, 1.2, EH, "token-mean")


def test_policy_gradient_at_ratio_one_is_minus_mean_adv_grad_logp():
    # Linear softmax policy: logits_t = W h_t, token y_t; d log pi(y|h)/dW = (onehot(y) - p) h^T.
    g = torch.Generator().manual_seed(6)
    V, H, B, T = 5, 3, 3, 6
    W = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    h = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (B, T), generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    logp = torch.log_softmax(h @ W.T, dim=-1).gather(-1, y[..., None])[..., 0]  # (B, T)
    algos.policy_loss(logp, logp.detach(), adv, mask, EL, EH, "token-mean").backward()
    p = torch.softmax(h @ W.T, dim=-1).detach().numpy()
    want, n = np.zeros((V, H)), int(mask.sum())
    for b, pos in enumerate(rows(mask)):
        for t in pos:
            score = -p[b, t]
            score[y[b, t]] += 1.0  # onehot - p
            want -= adv[b, t].item() * np.outer(score, h[b, t].numpy()) / n
    np.testing.assert_allclose(W.grad.numpy(), want, atol=1e-12)


def test_policy_loss_stats_counts():
    ratios = torch.tensor([[1.0, 1.5, 0.5, 1.1], [0.7, 4.0, 1.35, 1.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0], [-1.0, -1.0, 2.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    old = torch.zeros_like(ratios)
    st = algos.policy_loss_stats(torch.log(ratios), old, adv, mask, EL, EH, C)
    # live tokens: (1.0,+) (1.5,+ high) (0.5,+) (1.1,-) (0.7,- low) (4.0,- dual) (1.35,+ high)
    assert st["clip_high_frac"] == pytest.approx(2 / 7)
    assert st["clip_low_frac"] == pytest.approx(1 / 7)
    assert st["pg_clipfrac"] == pytest.approx(3 / 7)
    assert st["pg_clipfrac_lower"] == pytest.approx(1 / 7)
    want_kl = -sum(math.log(r) for r in [1.0, 1.5, 0.5, 1.1, 0.7, 4.0, 1.35]) / 7
    assert st["ppo_kl"] == pytest.approx(want_kl)


# ----------------------------------------------------------------------------------- regularisers
def test_kl_estimators_values_gradients_and_expectation():
    logp = torch.tensor([-1.0, -2.0, -0.1, -30.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.5, -0.5, -0.1, -1.0], dtype=torch.float64)
    for kind, f in [("k1", lambda l, r: l - r), ("k2", lambda l, r: 0.5 * (l - r) ** 2),
                    ("k3", lambda l, r: min(10.0, math.exp(r - l) - (r - l) - 1))]:
        out = algos.kl_term(logp, ref, kind)
        for i in range(4):
            assert out[i].item() == pytest.approx(f(logp[i].item(), ref[i].item()), rel=1e-12)
    assert algos.kl_term(logp, ref, "k3")[3].item() == 10.0  # clamped like verl
    # analytic gradients: k1 -> 1, k2 -> logp - ref, k3 -> 1 - pi_ref/pi (0 where clamped)
    for kind, grad in [("k1", lambda l, r: 1.0), ("k2", lambda l, r: l - r),
                       ("k3", lambda l, r: 1 - math.exp(r - l))]:
        (g,) = torch.autograd.grad(algos.kl_term(logp, ref, kind)[:3].sum(), logp)
        for i in range(3):
            assert g[i].item() == pytest.approx(grad(logp[i].item(), ref[i].item()), abs=1e-12)
    # E_{z ~ pi}[k1] = E[k3] = KL(pi || ref) exactly on a categorical; k2 is biased but >= 0.
    pi = torch.softmax(torch.tensor([0.3, -1.0, 2.0, 0.0], dtype=torch.float64), 0)
    rf = torch.softmax(torch.tensor([1.0, 0.5, -0.5, 0.2], dtype=torch.float64), 0)
    kl = sum(pi[i].item() * math.log(pi[i].item() / rf[i].item()) for i in range(4))
    for kind in ("k1", "k3"):
        assert (pi * algos.kl_term(pi.log(), rf.log(), kind)).sum().item() == pytest.approx(kl, rel=1e-12)
    assert torch.all(algos.kl_term(pi.log(), rf.log(), "k3") >= 0)
    with pytest.raises(ValueError, match="k1"):
        algos.kl_term(logp, ref, "low_var_kl")


def test_entropy_bonus_is_aggregated_entropy():
    ent = torch.rand(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        got = algos.entropy_bonus(ent, MASK, mode).item()
        assert got == pytest.approx(agg_reference(ent.tolist(), MASK, mode), abs=1e-12)


def test_value_loss_clipped_matches_loop():
    V = torch.tensor([[1.0, 2.0, 0.0, 5.0], [3.0, -1.0, 0.2, 9.0]], dtype=torch.float64, requires_grad=True)
    V_old = torch.tensor([[0.0, 2.2, 0.1, 0.0], [2.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    R = torch.tensor([[0.0, 3.0, 1.0, 0.0], [3.5, -2.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    got = algos.value_loss(V, V_old, R, mask, clip=0.5, agg="token-mean")
    terms = []
    for b in range(2):
        for t in range(3):
            v, vo, r = V[b, t].item(), V_old[b, t].item(), R[b, t].item()
            vc = min(max(v, vo - 0.5), vo + 0.5)
            terms.append(max((v - r) ** 2, (vc - r) ** 2))
    assert got.item() == pytest.approx(0.5 * sum(terms) / 6, abs=1e-12)
    # token (0, 0): V moved 1.0 away from V_old = R = 0, the clipped error 0.25 < 1.0 -> plain error used;
    # token (1, 0): V = R = 3.0 but V_old = 2.0, clipped V = 2.5 -> error 1.0 dominates (pessimistic)
    assert terms[0] == 1.0 and terms[3] == pytest.approx(1.0)
    unclipped = algos.value_loss(V, V_old, R, mask, clip=None)
    assert unclipped.item() == pytest.approx(0.5 * ((V - R) ** 2)[:, :3].mean().item())


# ----------------------------------------------------------------------------------- algorithm bundles
def test_algo_bundles_and_validation():
    assert set(algos.ALGO_NAMES) == {"ppo", "dapo", "grpo", "drgrpo", "dapo_code"}
    ppo, dapo, grpo, dr, code = (algos.get_algo(n) for n in ("ppo", "dapo", "grpo", "drgrpo", "dapo_code"))
    assert (ppo.adv_estimator, ppo.loss_agg_mode, ppo.clip_high, ppo.use_critic) == ("gae", "token-mean", 0.28, True)
    assert (ppo.gamma, ppo.lam) == (1.0, 1.0)
    assert (dapo.adv_estimator, dapo.clip_high, dapo.dynamic_sampling, dapo.use_critic, dapo.kl_coef) == \
        ("grpo", 0.28, True, False, 0.0)
    assert (grpo.normalize_std, grpo.loss_agg_mode) == (True, "seq-mean-token-mean")
    assert (dr.normalize_std, dr.loss_agg_mode) == (False, "seq-mean-token-sum")
    assert (code.adv_estimator, code.clip_high, code.use_critic, code.dynamic_sampling) == ("gae", 0.28, True, False)
    assert algos.get_algo("grpo", clip_high=0.2, kl_coef=0.001).kl_coef == 0.001
    with pytest.raises(ValueError, match="ppo.*dapo.*grpo.*drgrpo"):
        algos.get_algo("reinforce")
    with pytest.raises(ValueError, match="valid fields"):
        algos.get_algo("ppo", lr=1e-6)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        algos.get_algo("ppo", loss_agg_mode="sum")
    with pytest.raises(ValueError, match="kl_kind"):
        algos.get_algo("ppo", kl_kind="k4")


def test_objective_is_pg_minus_entropy_plus_kl_and_drops_zero_terms():
    pg, h, kl = torch.tensor(0.5), torch.tensor(2.0), torch.tensor(0.25)
    assert float(algos.objective(pg, h, kl, 0.1, 0.4)) == pytest.approx(0.5 - 0.1 * 2.0 + 0.4 * 0.25)
    assert float(algos.objective(pg, torch.tensor(float("nan")), None, 0.0, 0.0)) == 0.5   # coefficient 0: term gone
    with pytest.raises(ValueError):
        algos.objective(pg, h, None, 0.0, 0.1)
