"""Which MIL ops the engine runs, per generation: the operation-by-device matrix, as data.

The rows are the book's appendix A (sbryngelson/ane-guide appendices/a-op-device-matrix.md, CC BY 4.0),
one per intermediate-language operation the compiler exposes (187), with the status on each family and
the book's note. Marks, one letter per family in the order M1, M2, M3, M4/M5 (the book merges the M4
and M5 into one column):

- ``N`` native: "the operation compiles and runs on that family on the direct engine path";
- ``G`` family-gated: "no path on the listed family, native from the family named in the note";
- ``B`` bridge: "reachable only through a decompose, software fallback, or compiler-internal route,
  never as a standalone code-generated operation";
- ``X`` no path: "rejected on every family from the M1 through the M5, computed off-engine".

Status of the cells: "The M1, M2, and M5 columns are measured on physical silicon. The M3 column and the
M4 part of the merged M4 and M5 column are decompile-derived predictions from the per-chip tables". The
measurements went through the Espresso / e5rt runtime, which hands the MIL to the same compiler
(ANECompiler's ``ANECCompile``) that ``_ANEInMemoryModel compileWithQoS:`` calls (maderix/ANE pull request
#40 docs/ANE_CHAINING_RESEARCH.md): ``anekit.engine.ops`` weighs them for both compiled routes.
"""

from __future__ import annotations

FAMILIES = ("m1", "m2", "m3", "m4")  # the columns; m5 shares the m4 column
SOURCE = "sbryngelson/ane-guide appendices/a-op-device-matrix.md"

MATRIX: dict[str, tuple[str, str]] = {
    # Convolution, matrix multiply, and pooling
    "conv": (
        "NNNN",
        "M1 kernels up to 29x29, M5 up to 32x32; Winograd auto-selected for eligible 3x3 stride-1 convs",
    ),
    "conv_transpose": ("NNNN", "Deconvolution; strided axes use the small-kernel caps"),
    "linear": ("NNNN", "Folds to convolution when the right operand fits the on-chip working set"),
    "linear_activation": ("NNNN", "Fused linear and activation"),
    "matmul": ("NNNN", "Engine lane or convolution fold; same tensor caps as convolution"),
    "ne_matmul": ("NNNN", "Private engine-lane matrix-multiply unit"),
    "einsum": ("NNNN", "Lowers to a matmul and transpose chain"),
    "ne_conv": ("NNNN", "Private engine-lane convolution unit"),
    "avg_pool": ("NNNN", "Window up to 29 on the M1, up to 31 from the M2"),
    "max_pool": ("NNNN", ""),
    "l2_pool": ("NNNN", "Lookup-table pool"),
    "ne_pool": ("NNNN", "Private engine-lane pooling unit"),
    "pe_pool": ("NNNN", "Private planar-engine pooling unit"),
    "pe_elementwise": ("NNNN", "Private planar-engine elementwise unit"),
    "pe_goc": ("BBBB", "Private planar-engine gain-offset unit, compiler-internal"),
    "ne_bypass": ("BBBB", "Private engine-lane bypass unit, compiler-internal"),
    "scaled_dot_product_attention": ("NNNN", "Runs on the matmul and softmax path, not texture-gated"),
    # Normalization
    "batch_norm": ("NNNN", "Inference fold-to-affine; native statistics form from the M1"),
    "layer_norm": ("NNNN", ""),
    "instance_norm": ("NNNN", ""),
    "l2_norm": ("NNNN", ""),
    "local_response_norm": ("NNNN", "Measured on the M1"),
    # Elementwise arithmetic
    "abs": ("NNNN", ""),
    "add": ("NNNN", "Constant and tensor forms"),
    "sub": ("NNNN", "Lowered to add of a negated constant"),
    "mul": ("NNNN", "Constant and tensor forms"),
    "real_div": ("NNNN", "General divide"),
    "floor_div": ("NNNN", "Lookup-table assisted"),
    "pow": ("NNNN", ""),
    "square": ("NNNN", ""),
    "sqrt": ("NNNN", "Lookup-table activation"),
    "rsqrt": ("NNNN", "Lookup-table"),
    "inverse": ("NNNN", "Reciprocal lookup-table"),
    "maximum": ("NNNN", ""),
    "minimum": ("NNNN", ""),
    "mod": ("XXXX", "Decompose on host"),
    "cumsum": ("NNNN", "Native through a curated runtime path, not the standard compile path; M1 measured"),
    # Comparison and logical
    "equal": ("NNNN", ""),
    "not_equal": ("NNNN", ""),
    "greater": ("NNNN", ""),
    "greater_equal": ("NNNN", ""),
    "less": ("NNNN", ""),
    "less_equal": ("NNNN", ""),
    "logical_not": ("NNNN", ""),
    "select": ("NNNN", "The where operation"),
    "logical_and": ("XXXX", "Decompose through minimum or multiply on host"),
    "logical_or": ("XXXX", "Decompose through maximum on host"),
    "logical_xor": ("XXXX", "Decompose through not-equal on host"),
    # Activations
    "relu": ("NNNN", ""),
    "relu6": ("NNNN", "Lookup-table"),
    "leaky_relu": ("NNNN", "Lookup-table"),
    "prelu": ("NNNN", "Per-channel slope; native at rank 3 or above"),
    "clamped_relu": ("NNNN", "Lookup-table"),
    "thresholded_relu": ("NNNN", "Lookup-table"),
    "threshold": ("NNNN", "Lookup-table"),
    "clip": ("NNNN", "The clamp operation"),
    "elu": ("NNNN", "Lookup-table"),
    "sigmoid": ("NNNN", "Includes the hard variant"),
    "sigmoid_hard": ("NNNN", "Lookup-table"),
    "tanh": ("NNNN", "Lookup-table"),
    "scaled_tanh": ("NNNN", "Lookup-table"),
    "gelu": ("NNNN", "Lookup-table approximation"),
    "silu": ("NNNN", "Also named swish; lookup-table"),
    "softmax": ("NNNN", "Lookup-table"),
    "softplus": ("NNNN", "Lookup-table"),
    "softplus_parametric": ("NNNN", "Lookup-table"),
    "softsign": ("NNNN", "Lookup-table"),
    "erf": ("NNNN", "Lookup-table"),
    "exp": ("NNNN", "Lookup-table"),
    "exp2": ("NNNN", "Lookup-table"),
    "log": ("NNNN", "Lookup-table"),
    "sign": ("NNNN", "Lookup-table"),
    "ceil": ("NNNN", "Lookup-table"),
    "floor": ("NNNN", "Lookup-table"),
    "round": ("NNNN", "Round-to-nearest lookup-table"),
    # Reduction
    "reduce_sum": (
        "NNNN",
        "Reduced axis at or above 192 takes the transpose route, at or above 384 from the M3",
    ),
    "reduce_mean": ("NNNN", ""),
    "reduce_max": ("NNNN", ""),
    "reduce_min": ("NNNN", ""),
    "reduce_sum_square": (
        "NNNN",
        "The reduce-then-square fusion is M2 onward; the M1 emits an extra fp16 round",
    ),
    "reduce_l1_norm": ("NNNN", ""),
    "reduce_l2_norm": ("NNNN", ""),
    "reduce_log_sum": ("NNNN", "Lookup-table assisted"),
    "reduce_log_sum_exp": ("NNNN", "Lookup-table assisted"),
    "reduce_argmax": ("NNNN", "Per-axis argmax on all families"),
    "reduce_argmin": (
        "BBNN",
        "Per-axis argmin; the intermediate-language route is gated to the M3, the bridge route works on "
        "the M1 and M2",
    ),
    "reduce_prod": ("XXXX", "Decompose through log-sum-exp on host"),
    # Data movement and structural
    "reshape": ("NNNN", "Metadata edit"),
    "reshape_like": ("NNNN", ""),
    "expand_dims": ("NNNN", ""),
    "squeeze": ("NNNN", ""),
    "flatten2d": ("NNNN", ""),
    "transpose": ("NNNN", "Capped by the maximum transpose extent, 16384 through the M3, 65536 on the M5"),
    "concat": ("NNNN", "DMA"),
    "split": ("NNNN", ""),
    "stack": ("NNNN", ""),
    "pad": (
        "NNNN",
        "Constant pad is native everywhere; symmetric and reflect pad are texture-gated, software on the "
        "M1 and native from the M2",
    ),
    "slice_by_size": (
        "NNNN",
        "M1 and M2 nonzero width-offset routes through a fixed-point crop-DMA that saturates a magnitude "
        "above 4094 to infinity; clean from the M3",
    ),
    "slice_by_index": ("BBBB", "Static-offset slice folds into the descriptor inside a graph"),
    "slice_update": ("NNNN", ""),
    "reverse": ("NNNN", "Measured on the M1"),
    "reverse_sequence": ("XXXX", "Decompose on host"),
    "tile": ("NNNN", "Factors of 2, 3, 4, and 8"),
    "gather": (
        "NNNN",
        "M1 software path valid only for a batch of one and a depth of one; the hardware path is M2 onward",
    ),
    "gather_along_axis": ("NNNN", "Same M1 envelope caveat"),
    "gather_nd": (
        "BNNN",
        "M1 software envelope only (batch one, depth one, three-element index channel); native texture "
        "path from the M2",
    ),
    "scatter": ("XXXX", "Decompose on host"),
    "scatter_along_axis": ("XXXX", "Decompose on host"),
    "scatter_nd": ("XXXX", "Decompose on host"),
    "depth_to_space": ("NNNN", "The pixel-shuffle operation"),
    "space_to_depth": ("NNNN", "The pixel-unshuffle operation"),
    "pixel_shuffle": ("NNNN", "Engine-lane reorganization, factors of 2, 3, 4, and 8; z-factor must be 1"),
    "pixel_unshuffle": ("NNNN", "Engine-lane reorganization; input dimension divisible by the factor"),
    "space_to_batch": ("NNNN", "Factor in 2, 3, 4, 8; batch cap 4096 on older families, 65536 on the newer"),
    "batch_to_space": ("NNNN", "Inverse of the above"),
    "identity": ("NNNN", "Aliases a cast or no-op"),
    "fill": ("NNNN", "Constant tensor producer"),
    "fill_like": ("NNNN", "Constant tensor producer"),
    "range_1d": ("BBBB", "M1 code generation rejects it; host-precompute the constant"),
    "crop": ("NNNN", "Slice and crop, distinct from the texture crop-resize"),
    "band_part": ("XXXX", "Mask on host"),
    "non_zero": ("XXXX", "Data-dependent shape"),
    "one_hot": ("XXXX", "Decompose through an identity gather on host"),
    "shape": ("XXXX", "Static-shape graphs only"),
    "sliding_windows": ("XXXX", "Decompose on host"),
    # Image, resize, and texture
    "resize": (
        "BNNN",
        "Texture-gated; M1 takes a software transpose fallback with different rounding, native from the M2",
    ),
    "resize_bilinear": ("BNNN", "Software fallback on the M1"),
    "resize_nearest_neighbor": ("BNNN", "Software fallback on the M1"),
    "upsample_bilinear": ("BNNN", "Software fallback on the M1"),
    "upsample_nearest_neighbor": ("BNNN", "Software fallback on the M1"),
    "crop_resize": ("GNNN", "Texture engine, M2 onward; no host substitution wired"),
    "resample": ("GNNN", "Texture engine, M2 onward"),
    "affine": ("GNNN", "Texture engine, M2 onward"),
    "pixel_buffer_to_tensor": (
        "BBBB",
        "Four-character-code image input; an entitlement gate, not a chip gate",
    ),
    "tensor_to_pixel_buffer": ("BBBB", "Compiler-internal"),
    "gamma": ("BBBB", "Image-signal operation, compiler-internal"),
    "degamma": ("BBBB", "Image-signal operation, compiler-internal"),
    # Quantization and dtype
    "cast": ("NNNN", "fp16 to fp32 and bool native on the M1; cast to int32 is rejected on the M1"),
    "quantize": ("NNNN", "Not texture-gated"),
    "dequantize": ("NNNN", ""),
    "const": ("BBBB", "Folded at compile, not a standalone code-generated operation"),
    "constexpr_affine_dequantize": (
        "BBBB",
        "int4 lookup-table streams from the M1; int8 and affine fold to fp16 below the M2, and stream "
        "from the A14 and M2",
    ),
    "constexpr_lut_to_dense": (
        "NNNN",
        "Palette and lookup-table stream; int4 lookup-table streams natively from the M1",
    ),
    "constexpr_lut_to_sparse": ("BBBB", "Folded constant; sparse stream from the M3"),
    "constexpr_blockwise_shift_scale": (
        "BBNN",
        "Blockwise stream from the M3; folds to fp16 on the M1 and M2",
    ),
    "constexpr_sparse_blockwise_shift_scale": ("BBNN", "Sparse and blockwise stream from the M3"),
    "constexpr_sparse_to_dense": ("NNNN", "Sparse streams natively from the M1"),
    "constexpr_cast": ("XXXX", "Rejected on every family"),
    # Attention, control flow, and state
    "read_state": ("NNNN", "Stateful; needs the inout tensor-descriptor plumbing for a key-value cache"),
    "write_state": ("NNNN", "Stateful"),
    "tensor_buffer_to_tensor": ("BBBB", "Ring and streaming buffer mover, reachable inside a stateful graph"),
    "tensor_to_tensor_buffer": ("BBBB", "Compiler-internal"),
    "circular_buffer_to_tensor": ("BBBB", "Ring-buffer reader"),
    "tensor_to_circular_buffer": ("BBBB", "Ring-buffer writer"),
    "cond": ("BBBB", "No standalone code generation; flatten on host"),
    "while_loop": ("BBBB", "No standalone code generation; unroll on host"),
    "call": ("BBBB", "Inlined"),
    # Recurrent cells
    "gru": ("XXXX", "Unroll to a convolution, matmul, and activation graph on host"),
    "lstm": ("XXXX", "Unroll on host"),
    "rnn": ("XXXX", "Unroll on host"),
    # Trigonometric, special, and math
    "sin": ("GGNN", "Native from the M3; the M1 and M2 use a host polynomial"),
    "cos": ("GGNN", "Native from the M3; the M1 and M2 use a host polynomial"),
    "atan": ("NNNN", "The one trigonometric primitive native on the M1"),
    "tan": ("XXXX", "Decompose through a sin and cos identity on host"),
    "asin": ("XXXX", "Host decomposition"),
    "acos": ("XXXX", "Host decomposition"),
    "atanh": ("XXXX", "Host decomposition"),
    "asinh": ("XXXX", "Host decomposition"),
    "acosh": ("XXXX", "Host decomposition"),
    "sinh": ("XXXX", "Host decomposition"),
    "cosh": ("XXXX", "Host decomposition"),
    "cross_product": ("BBBB", "Reachable through the bridge route, measured on the M1"),
    "cost_volume": ("BBBB", "Reachable through the bridge route, measured on the M1"),
    "matrix_decomposition": ("BBBB", "No observed code generation"),
    # Detection and sampling
    "non_maximum_suppression": (
        "BBBB",
        "Reachable only with a CPU or GPU backend in the mask; the engine-only mask reports not supported"
        " on any backend, so it offloads to the CPU or GPU rather than the engine",
    ),
    "topk": (
        "GNNN",
        "Rank and sort bridge, M2 onward; the validator is callable on the M1 but code generation rejects it",
    ),
    "argsort": ("GNNN", "Sort family, M2 onward; code-generation-rejected on the M1"),
    "random_uniform": ("BBNN", "Hardware generator from the M3; host random below it"),
    "random_bernoulli": ("XXXX", "Host random"),
    "random_categorical": ("XXXX", "Host random"),
    "random_normal": ("XXXX", "Host random"),
    "list_gather": ("XXXX", "Tensor-list operation"),
    "list_length": ("XXXX", "Tensor-list operation"),
    "list_read": ("XXXX", "Tensor-list operation"),
    "list_scatter": ("XXXX", "Tensor-list operation"),
    "list_write": ("XXXX", "Tensor-list operation"),
    "make_list": ("XXXX", "Tensor-list operation"),
}


def marks(op: str) -> dict[str, str] | None:
    """The op's mark per generation (m1 ... m5), or None when the matrix has no row for it."""
    row = MATRIX.get(op)
    if row is None:
        return None
    m1, m2, m3, m45 = tuple(row[0])  # one letter per generation
    return {"m1": m1, "m2": m2, "m3": m3, "m4": m45, "m5": m45}
