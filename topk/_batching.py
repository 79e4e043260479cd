"""Batching rules for the custom operators of :mod:`topk._ops` (each rule is named in its operator's entry of
:data:`topk._ops.SPECS`), so that ``torch.func.vmap`` takes every loss.

Every operator already works on a batch of rows, so each rule moves the vmapped dimension in front of the rows (behind
the noise samples' dimension where a tensor has one: the noise, the selected positions), runs the operator once on the
larger batch, and says where the vmapped dimension of each output lies. An argument that is not vmapped is expanded (a
view). The backward operators have rules too, so that ``vmap(grad(f))`` (per-sample gradients) and ``jacrev`` work.

The noise follows ``vmap``'s ``randomness`` argument. Explicit noise (the PyTorch path) is drawn by PyTorch under vmap:
one draw per element with ``randomness="different"``, one shared draw with ``"same"``. The seeded operators (the CPU
kernel, the fused kernel) draw from a seed that is itself drawn under vmap: with ``"different"`` there is one seed per
element, and the batch runs as one call from the first element's seed, which gives every row of every element its own
draws (the noise is a function of the seed and of the draw's position in the batch); with ``"same"`` the seed is
shared and every element must see the same noise, so the operator runs once per element. With vmap's default
(``"error"``) PyTorch refuses to draw, and says so.
"""

from typing import Callable, Optional, Sequence

import torch


def _at(tensor: Optional[torch.Tensor], in_dim: Optional[int], batch_size: int, place: int) -> Optional[torch.Tensor]:
    """``tensor`` with the vmapped dimension at ``place``: moved there, or expanded there if it is not vmapped."""
    if tensor is None:
        return None
    if in_dim is None:
        return tensor.unsqueeze(place).expand(*tensor.shape[:place], batch_size, *tensor.shape[place:])
    return tensor.movedim(in_dim, place)


def leading(places: Sequence[Optional[int]], out_dims, seed: Optional[int] = None) -> Callable:
    """The rule of an operator that takes any leading batch shape. ``places``: where the vmapped dimension goes in each
    argument, 0 (the first batch dimension), 1 (behind the samples' dimension) or None (not a tensor, or a seed);
    ``out_dims``: where it lies in the outputs; ``seed``: the position of the seed among a seeded operator's
    arguments."""

    def rule(operator, info, in_dims, *args):
        if seed is not None and args[seed] is not None:
            if in_dims[seed] is None:  # randomness="same": every element the same noise
                return _per_element(operator, info.batch_size, in_dims, args)
            # randomness="different": one call from the first element's seed, its own draws for every row
            args = (*args[:seed], args[seed].select(in_dims[seed], 0), *args[seed + 1:])
        batched = [arg if place is None else _at(arg, in_dim, info.batch_size, place)
                   for arg, in_dim, place in zip(args, in_dims, places)]
        return operator(*batched), out_dims

    return rule


def _per_element(operator, batch_size: int, in_dims, args) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
    """``operator`` called on each element of the vmapped batch, its outputs stacked on their first dimension."""
    element = lambda v: [arg if in_dim is None else arg.select(in_dim, v)  # noqa: E731
                         for arg, in_dim in zip(args, in_dims)]
    outputs = [operator(*element(v)) for v in range(batch_size)]
    return tuple(torch.stack(parts) for parts in zip(*outputs)), (0,) * len(outputs[0])


def rows(operator, info, in_dims, *args):
    """The rule of an operator on ``[rows, ...]`` tensors: the vmapped dimension folded into the rows of every tensor
    argument."""
    size = info.batch_size
    batched = [_at(arg, in_dim, size, 0).flatten(0, 1) if isinstance(arg, torch.Tensor) else arg
               for arg, in_dim in zip(args, in_dims)]  # [V, rows, ...] -> [V * rows, ...]
    outputs = operator(*batched)
    if isinstance(outputs, torch.Tensor):
        return outputs.unflatten(0, (size, -1)), 0
    return tuple(output.unflatten(0, (size, -1)) for output in outputs), (0,) * len(outputs)
