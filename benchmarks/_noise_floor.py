"""The noise floor of the fused kernel: a bare Triton kernel that draws as many normals as the kernel would
(``tl.randn4x``, four per Philox counter) and only sums them, so its time is the cost of the noise alone."""

import triton
import triton.language as tl

COUNTERS_PER_PROGRAM = 1 << 14


@triton.jit
def _draw_and_sum(seed_ptr, out_ptr, n_counters, BLOCK: tl.constexpr, PER_PROGRAM: tl.constexpr):
    seed = tl.load(seed_ptr)
    start = tl.program_id(0) * PER_PROGRAM
    total = tl.zeros((BLOCK,), tl.float32)
    for offset in range(start, start + PER_PROGRAM, BLOCK):
        counters = offset + tl.arange(0, BLOCK)
        z0, z1, z2, z3 = tl.randn4x(seed, counters)
        total += tl.where(counters < n_counters, z0 + z1 + z2 + z3, 0.0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(total))


def draw_normals(n_normals: int, seed, out) -> None:
    """Draw ``n_normals`` (rounded up to a multiple of 4) on ``out``'s device; ``out`` holds one float32 per program
    (:func:`programs`); ``seed``: a one-element int64 tensor."""
    n_counters = -(-n_normals // 4)
    _draw_and_sum[(programs(n_normals),)](seed, out, n_counters, BLOCK=1024, PER_PROGRAM=COUNTERS_PER_PROGRAM)


def programs(n_normals: int) -> int:
    return max(1, -(-n_normals // (4 * COUNTERS_PER_PROGRAM)))
