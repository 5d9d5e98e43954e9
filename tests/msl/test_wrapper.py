"""The regenerated wrapper source equals, byte for byte, what MLX prints when it traces the kernel
inside ``mx.export_function(..., verbose=True)`` (possible on Linux, where it cannot run)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from macbatch.metal import kernels
from tests.support.attention_cases import Case
from tests.support.msl.wrapper import InputSpec, generate

BODY = """
uint i = thread_position_in_grid.x + a_shape[0] + b_strides[0] + b_ndim;
uint s = simdgroup_index_in_threadgroup * threads_per_threadgroup.x;
out[i] = a[i] + T(c) + b[s];
"""


def _mlx_printed(
    capfd, tmp_path, name, input_names, output_names, source, header, inputs, call_kwargs
):
    kernel = mx.fast.metal_kernel(
        name=name, input_names=input_names, output_names=output_names, source=source,
        header=header,
    )  # fmt: skip

    def traced(*args):
        return kernel(inputs=list(args), verbose=True, **call_kwargs)

    capfd.readouterr()
    mx.export_function(str(tmp_path / "traced.mlxfn"), traced, *inputs)
    printed = capfd.readouterr().out
    prefix = f"Generated source code for `{name}`:\n```\n"
    assert printed.startswith(prefix), printed[:200]
    return printed[len(prefix) : -len("\n```\n")]


def test_small_body_with_every_kind_of_parameter(capfd, tmp_path):
    inputs = [mx.zeros((16, 2)), mx.zeros((4,), mx.int32), mx.array(1.5)]
    kwargs = dict(
        output_shapes=[(16,), (3,)],
        output_dtypes=[mx.float16, mx.float32],
        grid=(16, 1, 1),
        threadgroup=(8, 1, 1),
        template=[("T", mx.float16), ("N", 7), ("B", True)],
    )
    names = ["a", "b", "c"], ["out", "o2"]
    printed = _mlx_printed(capfd, tmp_path, "wrap", *names, BODY, "// h\n", inputs, kwargs)
    gen = generate(
        "wrap", *names, BODY, "// h\n",
        [InputSpec(x.dtype, x.ndim, x.size) for x in inputs], kwargs["output_dtypes"],
        kwargs["template"],
    )  # fmt: skip
    assert gen.source == printed


# Metadata under 8 elements is `constant`; 12 sequences also run 4-bit pages (uint8 codes) and
# sparse attention (a list of 8 positions per row).
@pytest.mark.parametrize("num_seqs", [3, 12])
def test_paged_attention_kernel_source(capfd, tmp_path, num_seqs):
    source = (kernels.HERE / "paged_attention.metal").read_text()
    header = (kernels.HERE / "paged_attention.h").read_text()
    bits = 4 if num_seqs > 8 else 0
    if bits:
        pages = [mx.zeros((8, 2, 16, 32), mx.uint8)] * 2
        scales = [mx.zeros((8, 2, 16, 1, 2), mx.float16)] * 2
    else:
        pages = [mx.zeros((8, 2, 16, 64), mx.float16)] * 2
        scales = [mx.zeros((1,), mx.float16)] * 2
    inputs = [
        mx.zeros((num_seqs, 4, 64), mx.float16), *pages, mx.zeros((num_seqs, 2), mx.int32),
        mx.ones((num_seqs,), mx.int32), mx.arange(num_seqs + 1, dtype=mx.int32),
        mx.zeros((num_seqs * 2, 5), mx.int32), mx.zeros((6,), mx.int32), mx.zeros((2,)),
        mx.zeros((4,)), *scales, mx.zeros((num_seqs, 8) if bits else (1,), mx.int32),
    ]  # fmt: skip
    kwargs = dict(
        output_shapes=[(num_seqs, 4, 64), (1, 2, 2), (1, 2, 64)],
        output_dtypes=[mx.float16, mx.float32, mx.float32],
        grid=(num_seqs * 2 * 64, 1, 1),
        threadgroup=(64, 1, 1),
        template=[("T", mx.float16), ("D", 64), ("BS", 16), ("TK", 16), ("NSG", 2),
                  ("QPS", 1), ("SOFTCAP", False), ("SINKS", True), ("BITS", bits), ("GS", 64),
                  ("SPARSE", bits == 4)],
    )  # fmt: skip
    name = "macbatch_paged_attention"
    names = kernels.INPUT_NAMES, kernels.OUTPUT_NAMES
    printed = _mlx_printed(capfd, tmp_path, name, *names, source, header, inputs, kwargs)
    gen = generate(
        name, kernels.INPUT_NAMES, kernels.OUTPUT_NAMES, source, header,
        [InputSpec(x.dtype, x.ndim, x.size) for x in inputs], kwargs["output_dtypes"],
        kwargs["template"],
    )  # fmt: skip
    assert gen.source == printed
    assert ("const constant int32_t* seq_lens" in printed) == (num_seqs < 8)
    assert ("const device uint8_t* k_pages" in printed) == (bits == 4)


# The latent body as paged_attention_kernel calls it: 4-bit pages with a second source of rows
# (its codes, scales, table and lists as inputs), and float pages without one (placeholders).
@pytest.mark.parametrize("rows", [True, False])
def test_latent_kernel_source_as_called(capfd, tmp_path, rows):
    case = Case(
        [40, 20], [1, 3], top_k=8, row_counts=[6, 3] if rows else None,
        row_top_k=4 if rows else None, kv_bits=4 if rows else None, group_size=16 if rows else None,
        num_q_heads=16, num_kv_heads=1, head_dim=48, value_dim=36, block_size=8,
    )  # fmt: skip
    calls: list[tuple[dict, dict]] = []

    def recording(**made):
        def call(**called):
            calls.append((made, called))
            shapes, dtypes = called["output_shapes"], called["output_dtypes"]
            return [mx.zeros(s, d) for s, d in zip(shapes, dtypes, strict=True)]

        return call

    kernels.paged_attention_kernel(*case.args(poisoned=False), metal_kernel=recording)
    ((made, called),) = calls
    inputs = called.pop("inputs")
    names = made["input_names"], made["output_names"]
    printed = _mlx_printed(
        capfd, tmp_path, made["name"], *names, made["source"], made["header"], inputs, called
    )
    gen = generate(
        made["name"], *names, made["source"], made["header"],
        [InputSpec(x.dtype, x.ndim, x.size) for x in inputs], called["output_dtypes"],
        called["template"],
    )  # fmt: skip
    assert gen.source == printed
    assert ("const device uint8_t* row_pages" in printed) == rows
    assert ("const constant int32_t* row_selected" in printed) == (not rows)
