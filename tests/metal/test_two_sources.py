"""A second source of rows (``LayerParams.rows``, DeepSeek V4's compressed rows): the Metal path
against the float64 numpy oracle, through the MSL emulator."""

from __future__ import annotations

import pytest

from tests.support.attention_cases import Case, emulated_attention

LATENT = dict(num_q_heads=16, num_kv_heads=1, head_dim=48, value_dim=36, block_size=8)


def test_the_metal_kernel_refuses_rows_it_cannot_read():
    case = Case([40, 20], [1, 3], top_k=8, row_counts=[6, 3], row_top_k=4, **LATENT)
    with pytest.raises(ValueError, match="second source"):
        emulated_attention()(*case.args(poisoned=False))
