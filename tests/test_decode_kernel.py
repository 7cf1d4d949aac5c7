"""decode_kernel.py / decode_kernel.cpp: the fused decode attention against an independent fp64 reference (values
and log-sum-exp, fp32 and bf16 K/V, the compiled-in SmolLM2 shape and a generic one, bool / additive / no mask,
strided caches), the usual wrong versions, batch and thread independence, bad input, the off switch."""
import os
import platform
import shutil

import pytest
import torch

import decode_kernel

def _buildable() -> bool:
    from torch.utils.cpp_extension import is_ninja_available
    decode_kernel._with_ninja_on_path()
    return shutil.which(os.environ.get("CXX", "c++")) is not None and is_ninja_available()


pytestmark = pytest.mark.skipif(decode_kernel._choice() is None or (decode_kernel.op() is None and not _buildable()),
                                reason="kernel switched off, or no C++ compiler / ninja to build it (the matmul "
                                       "path is used)")


def test_it_builds_where_there_is_a_compiler():
    assert decode_kernel.status().startswith("built"), decode_kernel.status()


def _flags() -> set:
    try:
        return set(next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")).split(":")[1].split())
    except (OSError, StopIteration):
        return set()


# The code paths of decode_kernel.cpp, each built for this check: -march=native (AVX-512 where the CPU has it),
# x86-64-v3 (the AVX2 path), x86-64 (the generic loops), so that every path is tested on any x86 CPU with AVX2.
PATHS = {"native": "nanoragen", "x86-64-v3": "nanoragen_avx2", "x86-64": "nanoragen_generic"}


@pytest.fixture(params=list(PATHS), scope="module")
def path(request):
    march = request.param
    if march != "native" and (platform.machine() != "x86_64" or
                              (march == "x86-64-v3" and not {"avx2", "fma"} <= _flags())):
        pytest.skip(f"-march={march} cannot run on this CPU")
    op = decode_kernel.op() if march == "native" else decode_kernel.build(march, PATHS[march])
    return lambda q, k, v, mask=None, add=None: op(q.float().contiguous(), k, v, mask, add)


def reference(q, k, v, mask=None, add=None):
    """Independent fp64: scores q . k (q already scaled), + add, masked, softmax over t, times v; and logsumexp."""
    s = torch.einsum("bhgd,bhtd->bhgt", q.double(), k.double())
    if add is not None:
        s = s + add.double()[:, None, None, :]
    if mask is not None:
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    return torch.softmax(s, -1) @ v.double(), torch.logsumexp(s, -1)


def case(G, D, T=300, B=5, KVH=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, KVH, G, D, generator=g) * D ** -0.5
    k, v = torch.randn(B, KVH, T, D, generator=g), torch.randn(B, KVH, T, D, generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :70] = False                            # left padding
    mask[2, :5] = False
    mask[:, -40:] = False                           # a static cache's future slots
    mask[3, 100:103] = False                        # and masked slots between attended ones
    return q, k, v, mask


@pytest.mark.parametrize("G,D", [(3, 64), (1, 64), (2, 64), (4, 64), (8, 64), (2, 24)])  # SIMD (SmolLM2: 3, 64); loops
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-6)])
def test_equals_an_independent_reference(G, D, dtype, atol, path):
    q, k, v, mask = case(G, D)
    k, v = k.to(dtype), v.to(dtype)       # the reference reads the same (rounded) K and V: only the sums differ
    out, lse = path(q, k, v, mask)
    ref, ref_lse = reference(q, k, v, mask)
    assert out.dtype == lse.dtype == torch.float32 and out.shape == q.shape and lse.shape == q.shape[:3]
    assert (out.double() - ref).abs().max() < atol
    assert (lse.double() - ref_lse).abs().max() < 1e-5
    add = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))   # an additive mask means the same
    add[1, 100:110] = -3.5                                             # and finite biases are added
    out_a, lse_a = path(q, k, v, None, add)
    ref_a, ref_lse_a = reference(q, k, v, None, add)
    assert (out_a.double() - ref_a).abs().max() < atol and (lse_a.double() - ref_lse_a).abs().max() < 1e-5
    full, _ = path(q, k, v)                                            # no mask: every slot
    assert (full.double() - reference(q, k, v)[0]).abs().max() < atol
    # the usual mistakes are far outside the tolerance
    assert (out.double() - reference(q, k, v)[0]).abs().max() > 1e-2                 # mask ignored
    assert (out.double() - reference(q * D ** 0.5, k, v, mask)[0]).abs().max() > 1e-2   # scale applied twice / never
    assert (out.double() - reference(q.roll(1, dims=1), k, v, mask)[0]).abs().max() > 1e-2   # wrong KV head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_first_and_last_attended_slot(dtype, path):
    """The SIMD paths score slots four at a time from the first attended one: every start and length mod 4,
    including fewer than four slots, against the reference."""
    g = torch.Generator().manual_seed(1)
    for T in range(1, 12):
        for lo in range(T):
            q = torch.randn(2, 3, 3, 64, generator=g) * 0.125
            k, v = (torch.randn(2, 3, T, 64, generator=g).to(dtype) for _ in range(2))
            mask = torch.ones(2, T, dtype=torch.bool)
            mask[0, :lo] = False
            if T - lo > 2:
                mask[0, T - 1] = False                                  # and a masked last slot
            out, lse = path(q, k, v, mask)
            ref, ref_lse = reference(q, k, v, mask)
            assert (out.double() - ref).abs().max() < 2e-6, (T, lo)
            assert (lse.double() - ref_lse).abs().max() < 2e-6, (T, lo)


def test_strided_cache_views_and_large_scores():
    """K / V as views of a larger buffer (a static cache: more slots than T, rows taken from a pool), scores of
    several hundred (the max is subtracted before exp)."""
    q, k, v, mask = case(3, 64, T=200)
    big_k, big_v = torch.randn(7, 3, 260, 64), torch.randn(7, 3, 260, 64)
    big_k[2:, :, :200], big_v[2:, :, :200] = k, v
    kv_k, kv_v = big_k[2:, :, :200], big_v[2:, :, :200]                 # not contiguous
    assert not kv_k.is_contiguous()
    out, _ = decode_kernel.decode(q * 40, kv_k, kv_v, mask)
    ref, _ = reference(q * 40, k, v, mask)
    assert torch.isfinite(out).all()        # scores up to ~180: exp without subtracting the max overflows fp32
    assert (out.double() - ref).abs().max() < 1e-4      # fp32 scores of ~180 carry ~1e-5 of rounding (torch: 4e-6)


def test_nothing_attended_gives_zero_and_minus_infinity(path):
    q, k, v, mask = case(3, 64, T=150)
    mask[3] = False
    out, lse = path(q, k, v, mask)
    assert (out[3] == 0).all() and (lse[3] == float("-inf")).all()
    assert torch.isfinite(out).all() and torch.isfinite(lse[:3]).all()
    mask[1, 60:64] = False                                            # masked slots inside the attended range
    ref, _ = path(q, k, v, mask)
    k[~mask[:, None, :, None].expand_as(k)] = float("nan")            # whatever masked slots hold is never used
    v[~mask[:, None, :, None].expand_as(v)] = float("inf")
    again, _ = path(q, k, v, mask)
    assert torch.equal(again, ref)
    k[1, 0, 80] = float("nan")                                        # but a NaN in an attended slot shows
    assert torch.isnan(path(q, k, v, mask)[0][1, 0]).all()


def test_a_row_depends_on_nothing_but_itself():
    """Samples must not depend on which rows share the batch (finished rows leave it) nor on the thread count."""
    q, k, v, mask = case(3, 64, T=257)
    kb, vb = k.bfloat16(), v.bfloat16()
    out, lse = decode_kernel.decode(q, kb, vb, mask)
    alone, lse1 = decode_kernel.decode(q[2:3], kb[2:3], vb[2:3], mask[2:3])
    assert torch.equal(alone, out[2:3]) and torch.equal(lse1, lse[2:3])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, _ = decode_kernel.decode(q, kb, vb, mask)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, out)


def test_bad_input_is_refused():
    q, k, v, mask = case(3, 64, T=20)
    with pytest.raises(RuntimeError, match="both fp32 or both bf16"):
        decode_kernel.decode(q, k.bfloat16(), v, mask)
    with pytest.raises(RuntimeError, match="do not match"):
        decode_kernel.decode(q, k[:, :, :, :32], v[:, :, :, :32], mask)
    with pytest.raises(RuntimeError, match="mask must be bool"):
        decode_kernel.decode(q, k, v, mask[:, :10])
    with pytest.raises(RuntimeError, match="add must be fp32"):
        decode_kernel.decode(q, k, v, None, mask.double())


def test_off_switch():
    with decode_kernel.off():
        assert decode_kernel.op() is None and decode_kernel.status().startswith("off")
        with pytest.raises(RuntimeError, match="decode_kernel: off"):
            decode_kernel.decode(*case(3, 64, T=8))
    assert decode_kernel.op() is not None


def test_the_environment_switch(tmp_path):
    """$NANORAGEN_DECODE_KERNEL: 0 = off (the matmul path); a malformed value, or a -march value that does not
    build, is a one-line error naming the variable (never a silent fall back to the slower path)."""
    import subprocess
    import sys
    code = "import decode_kernel; print(decode_kernel.status())"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}        # builds of this test stay out of the cache
    run = lambda value: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,  # noqa: E731
                                       env={**env, decode_kernel.ENV: value}, timeout=300,
                                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    off = run("0")
    assert off.returncode == 0 and off.stdout.strip() == f"off (${decode_kernel.ENV}=0)"
    for value in ("no-such-cpu", "x86-64 -O0", "../up"):
        bad = run(value)
        assert bad.returncode != 0, value
        assert bad.stderr.strip().splitlines()[-1].startswith(f"ValueError: $NANORAGEN_DECODE_KERNEL={value!r}")
    assert [p.name for p in tmp_path.iterdir()] and all(p.name.startswith("nanoragen_decode_")   # only the failed
                                                        for p in tmp_path.iterdir())          # build, and in there


def test_a_build_killed_midway_does_not_hang_the_next(tmp_path):
    """torch's build leaves its lock file behind when the builder is killed (SIGKILL, or SIGTERM without Python's
    clean-up), and every later build then waits on it forever; ours builds anyway (it holds an OS lock instead)."""
    import subprocess
    import sys
    name = f"nanoragen_decode_{decode_kernel._build_tag('native')}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "lock").touch()                                 # what a killed build leaves
    done = subprocess.run([sys.executable, "-c", "import decode_kernel; print(decode_kernel.status())"],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), decode_kernel.ENV: "1"},
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and done.stdout.strip() == "built", done.stderr[-500:]
    assert list((tmp_path / name).glob("*.so")) and not (tmp_path / name / "lock").exists()   # built there


def test_it_runs_on_torchs_threads():
    """at::parallel_for is OpenMP inside its header: built without -fopenmp it silently runs on one thread. The
    library must call the OpenMP runtime, and that runtime must be torch's own copy (one thread pool)."""
    from pathlib import Path
    decode_kernel.op()
    libs = [ln.split()[-1] for ln in open("/proc/self/maps") if ".so" in ln]
    ours = {p for p in libs if Path(p).name.startswith("nanoragen_decode_")}
    assert ours and all(b"GOMP_parallel" in Path(p).read_bytes() for p in ours)
    assert len({Path(p).resolve() for p in libs if Path(p).name.startswith("libgomp")}) <= 1
