"""Quantized pages (8-bit and 4-bit) through all three attention paths: the emulated Metal
kernel, the C++ CPU kernel and the reference, each against the float64 numpy oracle run on the
numpy quantizer's dequantized pages (``tests/support/attention_cases.py``). For the Metal kernel
the hidden slots' scales are NaN, so reading a key it may not see shows.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macbatch.metal.cpu_kernel import paged_attention_cpu
from macbatch.metal.kernels import SplitPolicy
from macbatch.metal.quant import QuantizedPages, dequantize, quantize
from macbatch.metal.reference import paged_attention_reference
from tests.support.attention_cases import TOLERANCE, Case, emulated_attention, relative_error
from tests.support.attention_numpy import (
    dequantize_numpy,
    quantize_numpy,
)
from tests.support.msl.emulator import Emulator

F16, BF16, F32 = mx.float16, mx.bfloat16, mx.float32


def _check(case: Case, got: mx.array) -> None:
    tol = TOLERANCE[case.dtype]
    assert got.dtype == case.dtype and got.shape == case.out_shape
    err = relative_error(got, case.oracle())
    assert err <= tol, f"{err} > {tol}"


# The triangle tests' coverage, one quantization each: decode, fresh prefill, a chunk on cached
# context, mixed over more than 8 sequences, MHA, GQA 4 and 8, windows, softcap, sinks, block
# sizes 8/16/32, head dims 16/64/80/128, group sizes 32, 64 and the whole head dim.
CASES = {
    "decode_gqa2_8bit": Case([1, 17, 33, 64, 5], [1, 1, 1, 1, 1], kv_bits=8),
    "decode_gqa2_4bit_g32": Case([1, 17, 33, 64, 5], [1, 1, 1, 1, 1], kv_bits=4, group_size=32),
    "prefill_fresh_f16_4bit": Case([19, 40], [19, 40], dtype=F16, kv_bits=4),
    "chunk_on_cached_gqa4_8bit": Case(
        [45, 30], [13, 30], num_q_heads=8, num_kv_heads=2, kv_bits=8, group_size=32
    ),
    "mixed_over_8_seqs_bf16_4bit": Case(
        [1, 9, 16, 17, 3, 40, 2, 1, 25, 8], [1, 9, 1, 5, 1, 1, 2, 1, 1, 8], dtype=BF16, kv_bits=4
    ),
    "mha_d16_8bit": Case([1, 1, 2], [1, 1, 1], num_q_heads=2, num_kv_heads=2, head_dim=16,
                         kv_bits=8),
    "gqa8_window_softcap_sinks_f16_4bit": Case(
        [50, 21, 7], [1, 21, 3], num_q_heads=8, num_kv_heads=1, dtype=F16, sliding_window=9,
        softcap=10.0, sinks=True, kv_bits=4, group_size=32,
    ),
    "gqa4_window_block8_d128_8bit": Case(
        [33, 70], [6, 1], num_q_heads=4, num_kv_heads=1, head_dim=128, block_size=8,
        sliding_window=16, kv_bits=8,
    ),
    "d80_block32_sinks_4bit": Case(
        [31, 64], [4, 1], head_dim=80, block_size=32, sinks=True, kv_bits=4
    ),
    # MLA's latent pages: one row per token, the values its leading columns, read once.
    "latent_576_decode_8bit": Case(
        [40, 9, 1], [1, 1, 1], num_q_heads=16, num_kv_heads=1, head_dim=576, value_dim=512,
        dtype=F16, kv_bits=8, group_size=64,
    ),
    "latent_80_mixed_4bit_g16": Case(
        [21, 9, 30], [1, 9, 4], num_q_heads=16, num_kv_heads=1, head_dim=80, value_dim=64,
        kv_bits=4, group_size=16,
    ),
    "latent_40_chunk_on_cached_128_heads_8bit_g8": Case(
        [33, 9], [1, 2], num_q_heads=128, num_kv_heads=1, head_dim=40, value_dim=32,
        block_size=8, kv_bits=8, group_size=8,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_kernel_matches_numpy(name):
    case = CASES[name]
    _check(case, emulated_attention()(*case.args(poisoned=True)))


@pytest.mark.parametrize("name", list(CASES))
def test_reference_matches_numpy(name):
    case = CASES[name]
    _check(case, paged_attention_reference(*case.args(poisoned=False)))


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_kernel_matches_numpy(name):
    case = CASES[name]
    # Like the reference, it reads whole pages and masks the hidden slots' scores.
    _check(case, paged_attention_cpu(*case.args(poisoned=False)))


@pytest.mark.parametrize("bits", [8, 4])
def test_split_kv_two_pass_with_quantized_pages(bits):
    case = Case([300, 97, 3], [1, 1, 1], dtype=F16, sinks=True, kv_bits=bits, sliding_window=200)
    emulator = Emulator()
    attention = emulated_attention(emulator, SplitPolicy(64, min_keys=32, max_splits=8))
    _check(case, attention(*case.args(poisoned=True)))
    assert emulator.dispatches[-1].threadgroups > 6  # 3 seqs x 2 KV heads, some split


@pytest.mark.parametrize("head_dim,block_size,bits", [(256, 32, 4), (128, 32, 8)])
def test_largest_shapes_fit_threadgroup_memory(head_dim, block_size, bits):
    """The most scale groups per chunk (group size 32) stay within Apple's 32 KiB."""
    case = Case([40, 9], [1, 9], 8, 2, head_dim, block_size, F16, kv_bits=bits, group_size=32)
    emulator = Emulator()
    _check(case, emulated_attention(emulator)(*case.args(poisoned=True)))
    assert emulator.dispatches[-1].threadgroup_memory <= 32 * 1024


@pytest.mark.parametrize("bits", [8, 4])
def test_kernel_reads_fewer_bytes_by_the_quantization_ratio(bits):
    """A decode step reads each K/V code byte and each (scale, bias) once: exactly the page
    format's bytes for the visible keys, against 2 bytes per element for float16 pages."""
    float_case = Case([64, 40], [1, 1], 8, 2, 128, 16, F16)
    quant_case = Case([64, 40], [1, 1], 8, 2, 128, 16, F16, kv_bits=bits)
    read = []
    for case in (float_case, quant_case):
        emulator = Emulator()
        emulated_attention(emulator)(*case.args(poisoned=True))
        read.append(emulator.dispatches[-1].bytes_read)
    keys = 64 + 40
    per_key_head = 128 * bits // 8 + 2 * 2 * (128 // 64)  # codes + two (scale, bias) pairs
    assert read[0] == keys * 2 * 2 * 128 * 2  # K and V, 2 KV heads, float16
    assert read[1] == keys * 2 * 2 * per_key_head


@pytest.mark.parametrize("bits,group", [(8, 64), (8, 32), (4, 64), (4, 32)])
def test_quantizer_is_the_documented_format(bits, group):
    """MLX's quantizer writes exactly what the numpy one (from the format's definition) writes,
    and reads back exactly what the float64 dequantizer reads."""
    rng = np.random.default_rng(bits + group)
    x = (rng.standard_normal((50, 3, 128)) * rng.uniform(0.01, 30, (50, 3, 1))).astype(np.float32)
    x[0, 0, :group] = 1.25  # a constant group: scale 0
    codes, scales = quantize(mx.array(x), bits, group)
    want_codes, want_scales = quantize_numpy(x, bits, group)
    np.testing.assert_array_equal(np.array(codes), want_codes)
    np.testing.assert_array_equal(np.array(scales), want_scales)
    back = np.array(dequantize(codes, scales, bits, group))
    np.testing.assert_array_equal(back, dequantize_numpy(want_codes, want_scales, bits))
    # Within half a step, plus float16 rounding of the scale and bias.
    groups = x.reshape(50, 3, -1, group)
    spread = np.ptp(groups, axis=-1, keepdims=True)
    low = np.abs(groups.min(axis=-1, keepdims=True))
    bound = spread / (2**bits - 1) / 2 + (spread + low) * 2.0**-10
    assert (np.abs(back.reshape(groups.shape) - groups) <= bound).all()


def test_mismatched_pages_are_refused():
    case = Case([5], [1], kv_bits=8)
    q, k, v, *rest = case.args(poisoned=False)
    with pytest.raises(ValueError, match="both be quantized"):
        emulated_attention()(q, k, mx.zeros(k.shape), *rest)


def test_quantized_pages_shape_and_checks():
    codes, scales = mx.zeros((3, 2, 16, 32), mx.uint8), mx.zeros((3, 2, 16, 1, 2), mx.float16)
    assert QuantizedPages(codes, scales, 4, 64).shape == (3, 2, 16, 64)
    for bad in ((codes, scales, 8, 64), (codes, scales, 4, 48), (codes, scales, 3, 64),
                (codes.astype(mx.float16), scales, 4, 64)):  # fmt: skip
        with pytest.raises(ValueError, match="QuantizedPages: expected"):
            QuantizedPages(*bad)
