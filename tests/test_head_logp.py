"""head_logp.py: log p(y) and the entropy of softmax(z / T) with a hand-written backward, against an independent
fp64 autograd computation (values and the gradient of a weighted sum of both outputs), in fp32 and bf16, at T = 1
and T != 1, with either output unused, over several row blocks with a partial last one; and the usual mistakes
(the temperature left out of backward, the entropy term's + H or its sign) fail the same check."""
import pytest
import torch
import torch.nn.functional as F

import head_logp


def reference(z, y, T):
    """fp64 autograd: log_softmax(z / T), gather, -(p log p) summed."""
    la = F.log_softmax(z.double() / T, dim=-1)
    return la.gather(-1, y[:, None]).squeeze(-1), -(la.exp() * la).sum(-1)


def case(n=37, V=1000, scale=4.0, seed=0):
    """Logits with a few near-certain rows (scale x 10) beside flat ones; targets both likely and unlikely."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, V, generator=g) * scale
    z[::5] *= 10
    y = torch.randint(0, V, (n,), generator=g)
    y[::3] = z[::3].argmax(-1)
    w_lp, w_ent = torch.randn(n, generator=g), torch.randn(n, generator=g)
    return z, y, w_lp, w_ent


def grad_of(fn, z, y, T, w_lp, w_ent, use_lp=True, use_ent=True):
    z = z.clone().requires_grad_(True)
    lp, ent = fn(z, y, T)
    loss = (lp * w_lp).sum() * use_lp + ((ent * w_ent).sum() * use_ent if use_ent else 0)
    loss.backward()
    return lp.detach(), ent.detach(), z.grad


@pytest.mark.parametrize("T", [1.0, 0.7])
@pytest.mark.parametrize("use", [(True, True), (True, False), (False, True)])
def test_values_and_gradients_match_fp64_autograd(T, use):
    z, y, w_lp, w_ent = case()
    assert z.shape[0] % head_logp.ROWS != 0 and z.shape[0] > 2 * head_logp.ROWS   # several blocks, one partial
    with_ent = use[1]
    lp, ent, g = grad_of(lambda a, b, t: head_logp.logp_entropy(a, b, t, with_ent), z, y, T, w_lp, w_ent, *use)
    lp64, ent64, g64 = grad_of(reference, z.double(), y, T, w_lp.double(), w_ent.double(), *use)
    assert lp.dtype == torch.float32 and g.dtype == torch.float32
    assert torch.allclose(lp.double(), lp64, atol=2e-5, rtol=1e-6)
    if with_ent:
        assert torch.allclose(ent.double(), ent64, atol=2e-5, rtol=1e-6)
    else:
        assert ent.numel() == 0
    assert (g.double() - g64).abs().max() < 1e-6 * max(1.0, g64.abs().max().item())


def test_bf16_logits_give_a_bf16_gradient_within_bf16_rounding():
    z, y, w_lp, w_ent = case(seed=1)
    zb = z.bfloat16()
    lp, ent, g = grad_of(lambda a, b, t: head_logp.logp_entropy(a, b, t, True), zb, y, 0.7, w_lp, w_ent)
    lp64, ent64, g64 = grad_of(reference, zb.double(), y, 0.7, w_lp.double(), w_ent.double())  # same inputs
    assert lp.dtype == torch.float32 and g.dtype == torch.bfloat16
    assert torch.allclose(lp.double(), lp64, atol=2e-5, rtol=1e-6)    # the math is fp32: only the input is bf16
    assert torch.allclose(ent.double(), ent64, atol=2e-5, rtol=1e-6)
    assert torch.allclose(g.double(), g64, atol=1e-6, rtol=2 ** -8)    # one bf16 rounding of each entry


def test_the_usual_mistakes_fail_the_check():
    """Independent mistaken backwards, checked the way the test above checks the real one."""
    z, y, w_lp, w_ent = case(seed=2)
    T = 0.7
    g64 = grad_of(reference, z.double(), y, T, w_lp.double(), w_ent.double())[2]

    def mistaken(kind):
        la = F.log_softmax(z.double() / T, -1)
        p, H = la.exp(), -(la.exp() * la).sum(-1, keepdim=True)
        inner = w_lp[:, None].double() + w_ent[:, None].double() * (la + (0 if kind == "no +H" else H))
        grad = (-p * inner if kind != "entropy sign" else -p * (w_lp[:, None].double() - w_ent[:, None].double()
                                                                * (la + H)))
        grad = grad.scatter_add(-1, y[:, None], w_lp[:, None].double())
        return grad if kind == "no 1/T" else grad / T

    assert (mistaken("right") - g64).abs().max() < 1e-9                    # the formula itself is the reference
    for kind in ("no 1/T", "no +H", "entropy sign"):
        assert (mistaken(kind) - g64).abs().max() > 1e-3, kind


def test_bench_runs_and_restores_the_thread_count(capsys):
    """bench/head_logp.py end to end at a small shape (its timings are for the docs, never asserted)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "bench" / "head_logp.py"   # same name as the library module
    spec = importlib.util.spec_from_file_location("bench_head_logp", path)
    bench_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_module)
    threads = torch.get_num_threads()
    bench_module.main(["--rows", "20", "--vocab", "300", "--threads", str(threads + 1), "--reps", "1"])
    out = capsys.readouterr().out
    assert "| bfloat16 |" in out and "| float32 |" in out
    assert torch.get_num_threads() == threads
