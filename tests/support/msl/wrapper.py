"""Regenerates the exact Metal source MLX builds around a ``mx.fast.metal_kernel`` body.

This mirrors ``write_signature``/``write_template`` in MLX's ``metal_kernel.cpp`` (mlx 0.32): the
emulator compiles this text, and ``tests/msl/test_wrapper.py`` checks it byte for byte against what
MLX itself prints when the kernel is traced inside ``mx.export_function(..., verbose=True)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import mlx.core as mx

MAX_CONSTANT_ARRAY_SIZE = 8  # inputs with fewer elements are passed in the constant space

# (name, type), in MLX's order: an attribute is added when its name occurs in the body.
METAL_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
)

TYPE_STRINGS: dict[mx.Dtype, str] = {
    mx.bool_: "bool",
    mx.uint8: "uint8_t",
    mx.uint16: "uint16_t",
    mx.uint32: "uint32_t",
    mx.uint64: "uint64_t",
    mx.int8: "int8_t",
    mx.int16: "int16_t",
    mx.int32: "int32_t",
    mx.int64: "int64_t",
    mx.float16: "float16_t",
    mx.bfloat16: "bfloat16_t",
    mx.float32: "float",
    mx.complex64: "complex64_t",
}

TemplateArg = tuple[str, "int | bool | mx.Dtype"]


@dataclass(frozen=True)
class InputSpec:
    """What the generated signature depends on for one input: its dtype, rank and size."""

    dtype: mx.Dtype
    ndim: int
    size: int

    @property
    def in_constant_space(self) -> bool:
        return self.size < MAX_CONSTANT_ARRAY_SIZE


@dataclass(frozen=True)
class Param:
    """One parameter of the generated kernel function, in signature order."""

    name: str
    kind: str  # "input", "shape", "strides", "ndim", "output" or "attribute"
    index: int  # input/output index for buffers; unused for attributes
    ctype: str  # element or attribute type
    scalar: bool = False  # a 0-d input, passed by reference


@dataclass(frozen=True)
class GeneratedKernel:
    name: str
    source: str
    params: tuple[Param, ...]
    template_values: tuple[str, ...]


def type_string(dtype: mx.Dtype) -> str:
    return TYPE_STRINGS[dtype]


def _template_value(arg: int | bool | mx.Dtype) -> str:
    if isinstance(arg, bool):
        return "1" if arg else "0"
    if isinstance(arg, int):
        return str(arg)
    return type_string(arg)


def _template_kind(arg: int | bool | mx.Dtype) -> str:
    if isinstance(arg, bool):
        return "bool"
    if isinstance(arg, int):
        return "int"
    return "typename"


def generate(
    name: str,
    input_names: list[str],
    output_names: list[str],
    source: str,
    header: str,
    inputs: list[InputSpec],
    output_dtypes: list[mx.Dtype],
    template: list[TemplateArg],
    atomic_outputs: bool = False,
) -> GeneratedKernel:
    """The kernel's host name, full source text and parameter list, exactly as MLX writes them."""
    kernel_name = "custom_kernel_" + name
    values = tuple(_template_value(arg) for _, arg in template)
    template_def = "<" + ", ".join(values) + ">"
    if template:
        kernel_name += "_" + re.sub(r"<|>|(, )", "_", template_def)[:-1]
    for spec in inputs:
        kernel_name += "_" + type_string(spec.dtype)
        if spec.ndim == 0:
            kernel_name += "s"
        elif spec.in_constant_space:
            kernel_name += "c"
    for dtype in output_dtypes:
        kernel_name += "_" + type_string(dtype)

    attributes = [(attr, t) for attr, t in METAL_ATTRIBUTES if attr in source]
    params: list[Param] = []
    text = header
    if template:
        kinds = ", ".join(f"{_template_kind(arg)} {n}" for n, arg in template)
        text += f"template <{kinds}>\n"
    text += f"[[kernel]] void {kernel_name}(\n"
    index = 0
    for i, (iname, spec) in enumerate(zip(input_names, inputs, strict=True)):
        location = "constant" if spec.in_constant_space else "device"
        ref = "&" if spec.ndim == 0 else "*"
        ctype = type_string(spec.dtype)
        text += f"  const {location} {ctype}{ref} {iname} [[buffer({index})]],\n"
        params.append(Param(iname, "input", i, ctype, scalar=spec.ndim == 0))
        index += 1
        if spec.ndim > 0:
            for suffix, decl, kind in (
                ("_shape", "const constant int*", "shape"),
                ("_strides", "const constant int64_t*", "strides"),
                ("_ndim", "const constant int&", "ndim"),
            ):
                if iname + suffix in source:
                    text += f"  {decl} {iname}{suffix} [[buffer({index})]],\n"
                    params.append(Param(iname + suffix, kind, i, decl))
                    index += 1
    for i, (oname, dtype) in enumerate(zip(output_names, output_dtypes, strict=True)):
        ctype = type_string(dtype)
        if atomic_outputs:
            ctype = f"atomic<{ctype}>"
        text += f"  device {ctype}* {oname} [[buffer({index})]]"
        # MLX compares the buffer index (which counts shape buffers) with the number of inputs and
        # outputs; mirrored as is, so the text stays byte-identical.
        if index < len(inputs) + len(output_names) - 1 or attributes:
            text += ",\n"
        else:
            text += ") {\n"
        params.append(Param(oname, "output", i, ctype))
        index += 1
    for j, (attr, t) in enumerate(attributes):
        text += f"  {t} {attr} [[{attr}]]"
        text += ",\n" if j < len(attributes) - 1 else ") {\n"
        params.append(Param(attr, "attribute", -1, t))
    text += source + "\n}\n"
    if template:
        full = kernel_name + template_def
        text += f'\ntemplate [[host_name("{kernel_name}")]] [[kernel]] decltype({full}) {full};\n'
    return GeneratedKernel(kernel_name, text, tuple(params), values)
