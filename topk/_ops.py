"""The custom operators behind the smoothed top-K and the noised hinge, registered in the ``topk`` namespace.

Garcin et al. (ICML 2022) estimate ``topSigma_{K,eps}`` and ``top_{K,eps}`` by the mean over ``B`` noise
samples of ``topSigma_K`` / ``top_K`` of ``s + eps Z_b`` (Eq. 11), with the pathwise gradient of Prop. 3.3, the
mean of the selected one-hots (and, for the noised hinge, minus ``e_y``: Eq. 12). Five operators do it:

- ``topk::perturbed_top``: the PyTorch path, any device; the noise is an input (``B x ... x L``);
- ``topk::pruned_perturbed_top``: the CPU kernel of :mod:`topk._cpu_kernel`, drawing bounded noise only for the
  classes that can reach the top (exact pruning) from a seed given as a one-element tensor;
- ``topk::fused_perturbed_top``: the Triton kernel of :mod:`topk.fused` (CUDA; on a CPU only under Triton's
  interpreter); the noise is drawn in the kernel from a Philox seed given as a one-element device tensor,
  or given explicitly;
- ``topk::perturbed_top_backward``: the gradient of the first two, a scatter of ``grad / B`` at the saved positions;
- ``topk::fused_perturbed_top_backward``: the same gradient for the fused kernel's positions, written by one Triton
  kernel (:func:`topk.fused.kth_gradient`), zeros included.

Each has a fake (meta) implementation, and the three forward operators a registered autograd formula, so that
``torch.compile`` traces a loss as one graph (an operator is one opaque node: no graph break) and CUDA graphs
capture it. A backward run with ``create_graph=True`` computes the gradient in differentiable PyTorch operations
instead (the scatter, linear in the incoming gradient and constant in the scores; the smoothed hinge through the
log-sum-exps of :mod:`topk.elementary_symmetric`'s tree), so that it can be differentiated again. In eager mode the
forward operators also have forward-mode formulas, and every operator a batching rule (:mod:`topk._batching`), so
that ``torch.func``'s transforms (``grad``, ``vmap``, ``jacrev``, ``jvp``, ``jacfwd``) take them. The operators are
deterministic given their inputs; the randomness (the noise or the seed) is drawn by the caller from the device's
generator, so a captured graph draws fresh noise at every replay.

With ``labels`` the forward operators return ``mean_b top(s + eps Z_b) - s_y``, the term of the hinge (Eq. 10,
13), and the backward subtracts ``grad`` at ``y``: the loss's whole gradient is written in one pass.

The smoothed hinge of Berrada et al. (2018) has four more, on the kernel of :mod:`topk._esp_kernel`:
``topk::log_esp_pair`` (``log sigma_{k-1}`` and ``log sigma_k`` of ``exp(x)``, with the prefix products and chunk
complements the backward reads) and ``topk::log_esp_pair_backward``; and ``topk::smooth_hinge_rows`` (the whole loss
of each row, the same kernels run on the scores) with ``topk::smooth_hinge_rows_backward``.
"""

import contextlib
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from topk import _cpu_kernel, elementary_symmetric

__all__ = ["perturbed_top", "pruned_perturbed_top", "fused_perturbed_top", "perturbed_top_backward",
           "fused_perturbed_top_backward", "log_esp_pair",
           "log_esp_pair_backward", "smooth_hinge_rows", "smooth_hinge_rows_backward"]

def _accumulate_dtype(scores: Tensor) -> torch.dtype:
    return torch.promote_types(scores.dtype, torch.float32)


def _minus_true_scores(value: Tensor, scores: Tensor, labels: Optional[Tensor]) -> Tensor:
    """``value - s_y`` in ``value``'s (accumulation) dtype, or ``value`` without labels; then in the scores' dtype."""
    if labels is not None:
        value = value - scores.gather(-1, labels.unsqueeze(-1)).squeeze(-1).to(value.dtype)  # [..., L] -> [...]
    return value.to(scores.dtype)


def _mean_top(perturbed: Tensor, k: int, sum_top: bool, accumulate: torch.dtype) -> tuple[Tensor, Tensor]:
    """The mean over the samples (the first dimension) of ``top_k`` (``topSigma_k``) of the rows of ``perturbed``
    (``[B, ..., M]``) in the ``accumulate`` dtype (NaN for a row holding a NaN), and the selected positions, shape
    ``(B, ..., r)``."""
    values, positions = torch.topk(perturbed, k, dim=-1)  # [B, ..., M] -> [B, ..., k], sorted
    if sum_top:
        selected = values.sum(-1, dtype=accumulate)
    else:
        selected, positions = values[..., k - 1].to(accumulate).contiguous(), positions[..., k - 1:].contiguous()
    value = selected.sum(0) / perturbed.shape[0]  # [B, ...] -> [...], summed in the fused operator's order
    return torch.where(values[..., 0].isnan().any(0), float("nan"), value), positions


def _top_of_perturbed(scores: Tensor, noise: Tensor, k: int, epsilon: float, sum_top: bool) -> tuple[Tensor, Tensor]:
    """:func:`_mean_top` of ``s + eps z``, rounded twice (product, then sum) as the fused kernel does."""
    return _mean_top((noise * epsilon).add_(scores), k, sum_top, _accumulate_dtype(scores))


def _perturbed_top(scores: Tensor, noise: Tensor, k: int, epsilon: float, sum_top: bool,
                   labels: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Mean over the samples of ``top_k`` (``sum_top``: ``topSigma_k``) of ``s + epsilon Z_b`` (Eq. 11).

    ``scores``: ``(..., L)``; ``noise``: ``(B, ..., L)`` in the scores' dtype. Returns the value, shape ``(...)``
    (minus ``s_y`` with ``labels``), and the selected positions, int64 of shape ``(B, ..., r)`` with ``r = k``
    (``sum_top``) or 1. A row holding a NaN gets a NaN value (``torch.topk`` ranks NaN first).
    """
    value, positions = _top_of_perturbed(scores, noise, k, epsilon, sum_top)
    return _minus_true_scores(value, scores, labels), positions


perturbed_top = torch.library.custom_op("topk::perturbed_top", _perturbed_top, mutates_args=())


@perturbed_top.register_fake
def _(scores, noise, k, epsilon, sum_top, labels):
    positions_shape = (noise.shape[0], *scores.shape[:-1], k if sum_top else 1)
    return scores.new_empty(scores.shape[:-1]), scores.new_empty(positions_shape, dtype=torch.long)


def _pruned_perturbed_top(scores: Tensor, seed: Tensor, k: int, epsilon: float, n_samples: int, sum_top: bool,
                          labels: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """:func:`perturbed_top` on CPU, on the kernel of :mod:`topk._cpu_kernel`: the noise is its counter-based bounded
    normals for ``seed`` (a one-element int64 tensor), drawn only for the classes that can reach the top."""
    rows = scores.reshape(-1, scores.shape[-1])  # [..., L] -> [R, L]
    # [B, R] values and [B, R, r] positions
    selected, positions = _cpu_kernel.perturbed_top(rows, int(seed), k, epsilon, n_samples, sum_top)
    value = (selected.sum(0) / n_samples).reshape(scores.shape[:-1])  # a NaN row's samples are all NaN
    return _minus_true_scores(value, scores, labels), positions.reshape(n_samples, *scores.shape[:-1], -1)


pruned_perturbed_top = torch.library.custom_op("topk::pruned_perturbed_top", _pruned_perturbed_top, mutates_args=(),
                                               device_types="cpu")


@pruned_perturbed_top.register_fake
def _(scores, seed, k, epsilon, n_samples, sum_top, labels):
    positions_shape = (n_samples, *scores.shape[:-1], k if sum_top else 1)
    return scores.new_empty(scores.shape[:-1]), scores.new_empty(positions_shape, dtype=torch.long)


def _fused_perturbed_top(scores: Tensor, seed: Optional[Tensor], noise: Optional[Tensor], k: int, epsilon: float,
                         n_samples: int, labels: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Mean over the samples of the ``k``-th largest of ``s + epsilon Z_b`` on the fused kernel (:mod:`topk.fused`).

    Exactly one of ``seed`` (a one-element int64 tensor on the scores' device: in-kernel Philox noise) and
    ``noise`` (``(B, ..., L)``, explicit draws). Returns the value, shape ``(...)`` (minus ``s_y`` with
    ``labels``), and the positions, int32 of shape ``(B, ..., 1)``.
    """
    from topk import fused

    rows = scores.reshape(-1, scores.shape[-1])  # [..., L] -> [rows, L]
    if noise is not None:
        noise = noise.reshape(n_samples, *rows.shape)  # [B, ..., L] -> [B, rows, L]
    values, positions = fused.perturbed_kth_largest(rows, k, epsilon, n_samples, seed=seed, noise=noise)
    value = (values.sum(0) / n_samples).reshape(scores.shape[:-1])  # [B, rows] -> [...]
    return _minus_true_scores(value, scores, labels), positions.reshape(n_samples, *scores.shape[:-1], 1)


fused_perturbed_top = torch.library.custom_op("topk::fused_perturbed_top", _fused_perturbed_top, mutates_args=())


@fused_perturbed_top.register_fake
def _(scores, seed, noise, k, epsilon, n_samples, labels):
    positions_shape = (n_samples, *scores.shape[:-1], 1)
    return scores.new_empty(scores.shape[:-1]), scores.new_empty(positions_shape, dtype=torch.int32)


def _flat_positions(positions: Tensor) -> Tensor:
    """The saved positions of every sample side by side on the last dimension: ``[B, ..., r]`` -> ``[..., B * r]``."""
    return positions.movedim(0, -2).flatten(-2).long()


def _perturbed_top_backward(grad: Tensor, positions: Tensor, labels: Optional[Tensor], n_classes: int) -> Tensor:
    """``grad`` times the estimator's gradient: ``grad / B`` added at every saved position (Prop. 3.3), and
    ``-grad`` at the label when given (Eq. 12). ``grad``: ``(...)``, positions ``(B, ..., r)``; returns ``(..., L)``."""
    n_samples = positions.shape[0]
    flat_positions = _flat_positions(positions)
    weight = (grad / n_samples).unsqueeze(-1).expand(flat_positions.shape)
    grad_scores = grad.new_zeros((*grad.shape, n_classes)).scatter_add_(-1, flat_positions, weight)
    if labels is not None:
        grad_scores.scatter_add_(-1, labels.unsqueeze(-1), -grad.unsqueeze(-1))
    return grad_scores


perturbed_top_backward = torch.library.custom_op("topk::perturbed_top_backward", _perturbed_top_backward,
                                                 mutates_args=())


@perturbed_top_backward.register_fake
def _perturbed_top_backward_fake(grad, positions, labels, n_classes):
    return grad.new_empty((*grad.shape, n_classes))


def _save(ctx, *tensors):
    """What both the backward and the forward-mode formula read."""
    ctx.save_for_backward(*tensors)
    ctx.save_for_forward(*tensors)


def _save_positions(ctx, inputs, output):
    scores, labels = inputs[0], inputs[-1]
    _save(ctx, output[1], labels)
    ctx.set_materialize_grads(False)  # no zeros made for the positions' gradient, which is never read
    ctx.n_classes = scores.shape[-1]
    ctx.n_inputs = len(inputs)


def _scatter_gradient(ctx, grad_value, grad_positions, backward=perturbed_top_backward):
    if grad_value is None:  # nothing flows back through the value (gradients are not materialised)
        return (None,) * ctx.n_inputs
    positions, labels = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph=True: the scatter in autograd's view (linear in grad, 0 in the scores)
        backward = _perturbed_top_backward
    grad_scores = backward(grad_value, positions, labels, ctx.n_classes)
    return (grad_scores,) + (None,) * (ctx.n_inputs - 1)


def _fused_perturbed_top_backward(grad: Tensor, positions: Tensor, labels: Optional[Tensor], n_classes: int) -> Tensor:
    """:func:`_perturbed_top_backward` for the fused kernel's positions (int32, ``(B, ..., 1)``) in one kernel launch
    (:func:`topk.fused.kth_gradient`): the same numbers, the zeros written with the rest."""
    from topk import fused

    flat_labels = labels.reshape(-1) if labels is not None else None
    grad_scores = fused.kth_gradient(grad.reshape(-1), positions.reshape(positions.shape[0], -1), flat_labels,
                                     n_classes)  # [rows, L]
    return grad_scores.reshape(*grad.shape, n_classes)


fused_perturbed_top_backward = torch.library.custom_op("topk::fused_perturbed_top_backward",
                                                       _fused_perturbed_top_backward, mutates_args=())
fused_perturbed_top_backward.register_fake(_perturbed_top_backward_fake)


def _fused_gradient(ctx, grad_value, grad_positions, backward=fused_perturbed_top_backward):
    return _scatter_gradient(ctx, grad_value, grad_positions, backward=backward)


for _operator in (perturbed_top, pruned_perturbed_top):
    _operator.register_autograd(_scatter_gradient, setup_context=_save_positions)
fused_perturbed_top.register_autograd(_fused_gradient, setup_context=_save_positions)


def _top_tangent(ctx, tangent_scores, *unused):
    """Forward mode: the tangent of the estimate is the mean of the tangent's entries at the saved positions, minus its
    entry at the label (the gradient of Prop. 3.3 and Eq. 12 applied to the tangent); the positions have none."""
    if tangent_scores is None:
        return None, None
    positions, labels = ctx.saved_tensors
    tangent = tangent_scores.gather(-1, _flat_positions(positions)).sum(-1) / positions.shape[0]
    if labels is not None:
        tangent = tangent - tangent_scores.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return tangent, None


def _log_esp_pair(x: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(log sigma_{k-1}, log sigma_k)`` of ``exp(x)`` for each row of ``x`` (``[rows, n]`` -> ``[rows, 2]``), and what
    the backward reads (not differentiable): the prefix products ``[rows, n, block]`` and the chunks' complements
    ``[rows, chunks, block]``."""
    return elementary_symmetric.launch_pair_forward(x, k)


log_esp_pair = torch.library.custom_op("topk::log_esp_pair", _log_esp_pair, mutates_args=())


@log_esp_pair.register_fake
def _(x, k):
    return x.new_empty(x.shape[0], 2), *_walk_state_like(x, k)


def _walk_state_like(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Empty tensors shaped like the kernels' saved prefix products and chunk complements for the rows ``x``."""
    (n_rows, n), block = x.shape, elementary_symmetric.esp_block(k)
    return x.new_empty(n_rows, n, block), x.new_empty(n_rows, elementary_symmetric.esp_chunks(n), block)


def _log_esp_pair_backward(x: Tensor, prefix: Tensor, complement: Tensor, pair: Tensor, grad_pair: Tensor,
                           k: int) -> Tensor:
    """``sum_j grad_pair[:, j] d pair[:, j] / d x``, ``d log sigma_j / d x_i = e^{x_i} sigma_{j-1}(x without i) /
    sigma_j(x)``: ``[rows, n]``."""
    return elementary_symmetric.launch_pair_backward(x, prefix, complement, pair, grad_pair, k)


log_esp_pair_backward = torch.library.custom_op("topk::log_esp_pair_backward", _log_esp_pair_backward,
                                                mutates_args=())


@log_esp_pair_backward.register_fake
def _(x, prefix, complement, pair, grad_pair, k):
    return torch.empty_like(x)


def _save_prefix(ctx, inputs, output):
    _save(ctx, inputs[0], output[1], output[2], output[0])
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)
    ctx.k = inputs[1]


def _esp_gradient(ctx, grad_pair, *unused, backward=log_esp_pair_backward):
    x, prefix, complement, pair = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph=True, or under torch.func: through the same pair on the tree
        tree_pair = lambda x: elementary_symmetric.log_elementary_symmetric(x, ctx.k)[..., ctx.k - 1:]  # noqa: E731
        return torch.func.vjp(tree_pair, x)[1](grad_pair)[0], None
    return backward(x, prefix, complement, pair, grad_pair, ctx.k), None


log_esp_pair.register_autograd(_esp_gradient, setup_context=_save_prefix)


def _esp_tangent(ctx, tangent_x, *unused):
    """Forward mode: each of the pair's tangents is its gradient (one backward launch each) dotted with ``x``'s."""
    if tangent_x is None:
        return None, None, None
    x, prefix, complement, pair = ctx.saved_tensors
    unit = torch.eye(2, dtype=pair.dtype, device=pair.device)
    gradients = [log_esp_pair_backward(x, prefix, complement, pair, unit[j].expand_as(pair), ctx.k) for j in (0, 1)]
    return torch.stack([(gradient * tangent_x).sum(-1) for gradient in gradients], -1), None, None


def _smooth_hinge_rows(scores: Tensor, labels: Tensor, k: int, tau: float,
                       alpha: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The smoothed hinge of Berrada et al. (2018) of each row of ``scores`` (``[rows, n]``, labels ``[rows]``) in three
    kernel launches (:mod:`topk._esp_kernel`: the shift, the chunks, their combination): the loss ``[rows]``, then
    what the backward reads (the prefix products, the chunks' complements, the pair ``log sigma_{k-1}, log sigma_k``
    and ``(z, shift)``; not differentiable)."""
    return elementary_symmetric.launch_hinge_forward(scores, labels, k, tau, alpha)


smooth_hinge_rows = torch.library.custom_op("topk::smooth_hinge_rows", _smooth_hinge_rows, mutates_args=())


@smooth_hinge_rows.register_fake
def _(scores, labels, k, tau, alpha):
    n_rows = scores.shape[0]
    return (scores.new_empty(n_rows), *_walk_state_like(scores, k), scores.new_empty(n_rows, 2),
            scores.new_empty(n_rows, 2))


def _smooth_hinge_rows_backward(scores: Tensor, labels: Tensor, prefix: Tensor, complement: Tensor, pair: Tensor,
                                aux: Tensor, grad_loss: Tensor, k: int, tau: float) -> Tensor:
    """``d sum(grad_loss * loss) / d scores``, ``[rows, n]``, in one kernel launch."""
    return elementary_symmetric.launch_hinge_backward(scores, labels, prefix, complement, pair, aux, grad_loss, k, tau)


smooth_hinge_rows_backward = torch.library.custom_op("topk::smooth_hinge_rows_backward", _smooth_hinge_rows_backward,
                                                     mutates_args=())


@smooth_hinge_rows_backward.register_fake
def _(scores, labels, prefix, complement, pair, aux, grad_loss, k, tau):
    return torch.empty_like(scores)


def _save_hinge(ctx, inputs, output):
    scores, labels, ctx.k, ctx.tau, ctx.alpha = inputs
    _save(ctx, scores, labels, *output[1:])
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # no zero gradients made for the saved outputs (the prefix is [rows, n, block])


def _hinge_gradient(ctx, grad_loss, *unused, backward=smooth_hinge_rows_backward):
    scores, labels, prefix, complement, pair, aux = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph=True, or under torch.func: through the same loss on the tree
        from topk.losses.functional import _smooth_hinge_tree

        tree_loss = lambda scores: _smooth_hinge_tree(scores, labels, ctx.k, ctx.tau, ctx.alpha)  # noqa: E731
        return torch.func.vjp(tree_loss, scores)[1](grad_loss)[0], None, None, None, None
    return backward(scores, labels, prefix, complement, pair, aux, grad_loss, ctx.k, ctx.tau), None, None, None, None


smooth_hinge_rows.register_autograd(_hinge_gradient, setup_context=_save_hinge)


def _hinge_tangent(ctx, tangent_scores, *unused):
    """Forward mode: the loss's gradient (one backward launch) dotted with the scores' tangent."""
    if tangent_scores is None:
        return (None,) * 5
    scores, labels, prefix, complement, pair, aux = ctx.saved_tensors
    gradient = smooth_hinge_rows_backward(scores, labels, prefix, complement, pair, aux,
                                          scores.new_ones(scores.shape[0]), ctx.k, ctx.tau)
    return (gradient * tangent_scores).sum(-1), None, None, None, None


class _Autograd(NamedTuple):
    """An operator, its implementation, its autograd formula, its backward operator's implementation and its
    forward-mode formula."""

    operator: Callable
    implementation: Callable
    setup_context: Callable
    gradient: Callable
    backward: Callable
    tangent: Callable


class _EagerCall(torch.autograd.Function):
    """An operator's implementation and autograd formula called directly: the operator's computation without its
    dispatch (the custom operator's Python wrappers cost about 0.1 ms of host time per forward and backward). Its
    context is set apart from the forward and it has a forward-mode formula and a batching rule, so that ``torch.func``
    takes it."""

    @staticmethod
    def forward(autograd: _Autograd, *args):
        return autograd.implementation(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        autograd, *args = inputs
        autograd.setup_context(ctx, args, output)
        ctx.autograd = autograd

    @staticmethod
    def backward(ctx, *grads):
        if _transformed(grads):  # under torch.func: the backward operator, which has a batching rule
            return (None, *ctx.autograd.gradient(ctx, *grads))
        return (None, *ctx.autograd.gradient(ctx, *grads, backward=ctx.autograd.backward))

    @staticmethod
    def jvp(ctx, _, *tangents):
        """Forward mode (``torch.func.jvp``, ``jacfwd``, ``hessian``), from the tensors saved for the backward."""
        return ctx.autograd.tangent(ctx, *tangents)

    @staticmethod
    def vmap(info, in_dims, autograd, *args):
        """``torch.func.vmap``: the operator's batching rule (:mod:`topk._batching`)."""
        from topk._batching import RULES

        return RULES[autograd.operator](info, in_dims[1:], *args)


_EAGER = {entry.operator: entry for entry in (
    _Autograd(perturbed_top, _perturbed_top, _save_positions, _scatter_gradient, _perturbed_top_backward, _top_tangent),
    _Autograd(pruned_perturbed_top, _pruned_perturbed_top, _save_positions, _scatter_gradient, _perturbed_top_backward,
              _top_tangent),
    _Autograd(fused_perturbed_top, _fused_perturbed_top, _save_positions, _fused_gradient,
              _fused_perturbed_top_backward, _top_tangent),
    _Autograd(log_esp_pair, _log_esp_pair, _save_prefix, _esp_gradient, _log_esp_pair_backward, _esp_tangent),
    _Autograd(smooth_hinge_rows, _smooth_hinge_rows, _save_hinge, _hinge_gradient, _smooth_hinge_rows_backward,
              _hinge_tangent),
)}


_through_operators = False


@contextlib.contextmanager
def through_operators():
    """Within it, eager calls go through the registered operators too, as ``torch.compile``'s do: each is one node at
    the dispatcher (what the tests that count dispatched operators see)."""
    global _through_operators
    previous, _through_operators = _through_operators, True
    try:
        yield
    finally:
        _through_operators = previous


def call(operator, *args):
    """``operator(*args)`` for one of the forward operators: the operator itself while ``torch.compile`` traces (one
    opaque node of the graph), in eager mode the same implementation and gradient through :class:`_EagerCall`."""
    if _through_operators or torch.compiler.is_compiling():
        return operator(*args)
    return _EagerCall.apply(_EAGER[operator], *args)


def _transformed(args) -> bool:
    """Whether a tensor among ``args`` is wrapped by a ``torch.func`` transform (vmap needs the operators' batching
    rules, :mod:`topk._batching`)."""
    return any(isinstance(arg, Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(arg) for arg in args)


from topk import _batching  # noqa: E402, F401  (registers the batching rules of the operators above)
