"""Triangle tests: the emulated Metal kernel vs ``reference.py`` vs float64 numpy.

A representative subset runs by default; the full matrix (every head dim, block size and dtype)
is marked slow.
"""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

from macbatch.metal.kernels import SplitPolicy
from macbatch.metal.reference import paged_attention_reference
from tests.support.attention_cases import TOLERANCE, Case, emulated_attention, relative_error
from tests.support.msl.emulator import Emulator

F16, BF16, F32 = mx.float16, mx.bfloat16, mx.float32


def check_triangle(case: Case, split: SplitPolicy | None = None, emulator: Emulator | None = None):
    want = case.oracle()
    kernel = emulated_attention(emulator, split)
    got = kernel(*case.args(poisoned=True))
    ref = paged_attention_reference(*case.args(poisoned=False))
    tol = TOLERANCE[case.dtype]
    assert got.dtype == case.dtype and got.shape == case.out_shape
    assert relative_error(got, want) <= tol, f"kernel vs numpy: {relative_error(got, want)}"
    assert relative_error(ref, want) <= tol, f"reference vs numpy: {relative_error(ref, want)}"


DEFAULT_CASES = {
    "decode_only_gqa2": Case([1, 17, 33, 64, 5], [1, 1, 1, 1, 1]),
    "prefill_only_fresh": Case([19, 40], [19, 40], dtype=F16),
    "prefill_chunk_on_cached_context": Case([45, 30], [13, 30], num_q_heads=8, num_kv_heads=2),
    "mixed_over_8_seqs_bf16": Case(
        [1, 9, 16, 17, 3, 40, 2, 1, 25, 8], [1, 9, 1, 5, 1, 1, 2, 1, 1, 8], dtype=BF16
    ),
    "mha_q_len_1_seq_len_1": Case([1, 1, 2], [1, 1, 1], num_q_heads=2, num_kv_heads=2),
    "gqa8_window_softcap_sinks_f16": Case(
        [50, 21, 7],
        [1, 21, 3],
        num_q_heads=8,
        num_kv_heads=1,
        dtype=F16,
        sliding_window=9,
        softcap=10.0,
        sinks=True,
    ),  # fmt: skip
    "gqa4_window_block8_d128": Case(
        [33, 70],
        [6, 1],
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=128,
        block_size=8,
        sliding_window=16,
    ),  # fmt: skip
    "d80_block32_sinks": Case([31, 64], [4, 1], head_dim=80, block_size=32, sinks=True),
}


@pytest.mark.parametrize("name", list(DEFAULT_CASES))
def test_kernel_matches_reference_and_numpy(name):
    check_triangle(DEFAULT_CASES[name])


# MLA's latent pages (one KV head; rows Dk wide, values their leading Dv columns): the real width
# with few rows, narrow rows for the rest of the coverage, 16 and 128 query heads on the one head.
LATENT_CASES = {
    "latent_576_decode_f16": Case(
        [20, 9, 1], [1, 1, 1], num_q_heads=16, num_kv_heads=1, head_dim=576, value_dim=512,
        dtype=F16,
    ),
    "latent_576_chunk_on_cached_block32": Case(
        [20, 9], [6, 9], num_q_heads=16, num_kv_heads=1, head_dim=576, value_dim=512,
        block_size=32,
    ),
    "latent_80_52_prefill_fresh_bf16": Case(  # values no multiple of a lane's 32 columns
        [19, 12], [19, 12], num_q_heads=16, num_kv_heads=1, head_dim=80, value_dim=52, dtype=BF16,
    ),
    "latent_80_window_softcap_sinks_f16": Case(  # no MLA model has them; the body reads them
        [50, 21, 7], [1, 21, 3], num_q_heads=16, num_kv_heads=1, head_dim=80, value_dim=64,
        dtype=F16, sliding_window=9, softcap=10.0, sinks=True,
    ),
    "latent_40_mixed_128_heads_block8": Case(
        [40, 3, 12, 1, 25], [1, 3, 5, 1, 1], num_q_heads=128, num_kv_heads=1, head_dim=40,
        value_dim=32, block_size=8,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(LATENT_CASES))
def test_latent_pages_match_reference_and_numpy(name):
    check_triangle(LATENT_CASES[name])


def test_latent_split_kv_two_pass_matches():
    """A long latent decode over too few work items is split and merged at the value width."""
    case = Case(
        [300, 97, 3], [1, 1, 1], num_q_heads=16, num_kv_heads=1, head_dim=80, value_dim=64,
        dtype=BF16,
    )  # fmt: skip
    emulator = Emulator()
    check_triangle(case, SplitPolicy(target_threadgroups=64, min_keys=32, max_splits=8), emulator)
    assert emulator.dispatches[-1].threadgroups > 3  # 3 seqs x 1 tile of 16 heads, some split


def test_latent_chunk_fits_threadgroup_memory():
    """Rows 576 wide, 4-bit in groups of 32 (the most scales per row): within Apple's 32 KiB."""
    case = Case(
        [40, 9], [1, 9], num_q_heads=16, num_kv_heads=1, head_dim=576, value_dim=512,
        block_size=32, dtype=F16, kv_bits=4, group_size=32,
    )  # fmt: skip
    emulator = Emulator()
    check_triangle(case, emulator=emulator)
    assert emulator.dispatches[-1].threadgroup_memory <= 32 * 1024


def test_split_kv_two_pass_matches():
    """Long decodes over too few work items are split across threadgroups and merged."""
    case = Case([300, 97, 3], [1, 1, 1], num_q_heads=4, num_kv_heads=2, dtype=F16, sinks=True)
    emulator = Emulator()
    check_triangle(case, SplitPolicy(target_threadgroups=64, min_keys=32, max_splits=8), emulator)
    assert emulator.dispatches[-1].threadgroups > 6  # 3 seqs x 2 KV heads, some split


def test_split_kv_with_window_and_empty_shares():
    """Window start inside a split range, and shares with no visible key, merge correctly."""
    case = Case([200, 150], [1, 1], sliding_window=40, softcap=8.0, seed=3)
    check_triangle(case, SplitPolicy(target_threadgroups=64, min_keys=16, max_splits=12))


@pytest.mark.parametrize("order", ["reverse", "random"])
def test_lane_order_does_not_matter(order):
    """Running lanes in another order between sync points gives the same answer."""
    check_triangle(DEFAULT_CASES["prefill_chunk_on_cached_context"], emulator=Emulator(order))


@pytest.mark.slow
@pytest.mark.parametrize(
    "head_dim,block_size,dtype",
    list(itertools.product([64, 80, 96, 128, 256], [8, 16, 32], [F32, F16, BF16])),
)
def test_full_matrix(head_dim, block_size, dtype):
    seed = head_dim + block_size
    rng = np.random.default_rng(seed)
    group = [1, 2, 4, 8][seed % 4]
    n = 3 + seed % 9  # fewer and more than 8 sequences
    lens = rng.integers(1, 50, size=n)
    q_lens = [int(min(x, rng.choice([1, 1, 4, 50]))) for x in lens]
    case = Case(
        lens.tolist(), q_lens, num_q_heads=group * 2, num_kv_heads=2, head_dim=head_dim,
        block_size=block_size, dtype=dtype, sliding_window=[None, 12][seed % 2],
        softcap=[None, 15.0][(seed // 2) % 2], sinks=bool(seed % 3), seed=seed,
    )  # fmt: skip
    check_triangle(case)


@pytest.mark.parametrize("bits", [None, 4])
def test_latent_decode_reads_each_row_once(bits):
    """16 query heads on one latent head are one tile: each visible row's bytes (float16, or
    4-bit codes and their (scale, bias) pairs) are read once, for the scores and the values."""
    case = Case(
        [64, 40], [1, 1], num_q_heads=16, num_kv_heads=1, head_dim=576, value_dim=512, dtype=F16,
        kv_bits=bits, group_size=64 if bits else None,
    )  # fmt: skip
    emulator = Emulator()
    emulated_attention(emulator)(*case.args(poisoned=True))
    row_bytes = 576 * 2 if bits is None else 576 // 2 + 576 // 64 * 2 * 2
    assert emulator.dispatches[-1].bytes_read == (64 + 40) * row_bytes
