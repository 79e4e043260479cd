"""The custom operators of the ``topk`` namespace, registered from one table, :data:`SPECS`: each operator's
computation, fake implementation and batching rule, and for a forward operator its gradient and forward-mode formulas.

The forward operators are the perturbed top-K estimate of Garcin et al. (ICML 2022, Eq. 11; gradient: Prop. 3.3 and
Eq. 12) on three paths (:mod:`topk._perturbed_top`) and the smoothed hinge of Berrada et al. (2018), or its pair of
polynomials, on the Triton kernels (:mod:`topk._esp_launch`); each has a backward operator. An operator is one opaque
node for ``torch.compile`` (no graph break), which CUDA graphs capture. It is deterministic given its inputs: the
noise or the seed is drawn by the caller from the device's generator, so a captured graph draws fresh noise at every
replay.

A gradient takes one of three routes (:func:`_gradient`): the backward's computation called directly (eager mode), the
backward operator (compiled, or under a ``torch.func`` transform, which needs its batching rule), or, where the
backward must itself be differentiable (``create_graph=True``, ``torch.func``'s ``grad``), PyTorch operations: the
scatter of Prop. 3.3, or autograd through the tree of :mod:`topk._esp_tree`. :func:`call` runs a forward operator in
eager mode without the dispatcher.
"""

import contextlib
import functools
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from topk import _batching, _esp_launch, _perturbed_top
from topk._esp_tree import log_pair
from topk._labels import true_scores
from topk._smooth_hinge_tree import smooth_hinge_tree

__all__ = ["perturbed_top", "pruned_perturbed_top", "fused_perturbed_top", "perturbed_top_backward",
           "fused_perturbed_top_backward", "log_esp_pair", "log_esp_pair_backward", "smooth_hinge_rows",
           "smooth_hinge_rows_backward", "call", "through_operators", "SPECS"]


# Fake implementations: the outputs' shapes and dtypes, for torch.compile's fake tensors.


def _estimate_like(scores: Tensor, n_samples: int, ranks: int, positions_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """A perturbed top-K estimate, ``scores.shape[:-1]``, and its positions, ``(n_samples, ..., ranks)``."""
    positions_shape = (n_samples, *scores.shape[:-1], ranks)
    return scores.new_empty(scores.shape[:-1]), scores.new_empty(positions_shape, dtype=positions_dtype)


def _perturbed_top_fake(scores, noise, k, epsilon, sum_top, labels):
    return _estimate_like(scores, noise.shape[0], k if sum_top else 1, torch.long)


def _pruned_perturbed_top_fake(scores, seed, k, epsilon, n_samples, sum_top, labels):
    return _estimate_like(scores, n_samples, k if sum_top else 1, torch.long)


def _fused_perturbed_top_fake(scores, seed, noise, k, epsilon, n_samples, labels):
    return _estimate_like(scores, n_samples, 1, torch.int32)


def _scatter_fake(grad, positions, labels, n_classes):
    return grad.new_empty((*grad.shape, n_classes))


def _walk_state_like(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Empty tensors shaped like the kernels' saved prefix products and chunk complements for the rows ``x``."""
    (n_rows, n), block = x.shape, _esp_launch.esp_block(k)
    return x.new_empty(n_rows, n, block), x.new_empty(n_rows, _esp_launch.esp_chunks(n), block)


def _log_esp_pair_fake(x, k):
    return x.new_empty(x.shape[0], 2), *_walk_state_like(x, k)


def _log_esp_pair_backward_fake(x, prefix, complement, pair, grad_pair, k):
    return torch.empty_like(x)


def _smooth_hinge_rows_fake(scores, labels, k, tau, alpha):
    n_rows = scores.shape[0]
    return (scores.new_empty(n_rows), *_walk_state_like(scores, k), scores.new_empty(n_rows, 2),
            scores.new_empty(n_rows, 2))


def _smooth_hinge_rows_backward_fake(scores, labels, prefix, complement, pair, aux, grad_loss, k, tau):
    return torch.empty_like(scores)


# Gradients and forward-mode formulas. A gradient formula takes the backward to call: the backward operator or its
# computation (topk._perturbed_top, topk._esp_launch), which have the same signature.


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


def _scatter_gradient(ctx, grad_value, grad_positions, backward):
    if grad_value is None:  # nothing flows back through the value (gradients are not materialised)
        return (None,) * ctx.n_inputs
    positions, labels = ctx.saved_tensors
    grad_scores = backward(grad_value, positions, labels, ctx.n_classes)
    return (grad_scores,) + (None,) * (ctx.n_inputs - 1)


def _differentiable_scatter_gradient(ctx, grad_value, grad_positions):
    """The scatter in autograd's view: linear in the incoming gradient, constant in the scores."""
    return _scatter_gradient(ctx, grad_value, grad_positions, _perturbed_top.perturbed_top_backward)


def _top_tangent(ctx, tangent_scores, *unused):
    """Forward mode: the tangent of the estimate is the mean of the tangent's entries at the saved positions, minus its
    entry at the label (the gradient of Prop. 3.3 and Eq. 12 applied to the tangent); the positions have none."""
    if tangent_scores is None:
        return None, None
    positions, labels = ctx.saved_tensors
    tangent = tangent_scores.gather(-1, _perturbed_top.flat_positions(positions)).sum(-1) / positions.shape[0]
    if labels is not None:
        tangent = tangent - true_scores(tangent_scores, labels)
    return tangent, None


def _save_prefix(ctx, inputs, output):
    _save(ctx, inputs[0], output[1], output[2], output[0])
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)
    ctx.k = inputs[1]


def _esp_gradient(ctx, grad_pair, *unused, backward):
    x, prefix, complement, pair = ctx.saved_tensors
    return backward(x, prefix, complement, pair, grad_pair, ctx.k), None


def _differentiable_esp_gradient(ctx, grad_pair, *unused):
    """Through the same pair on the tree, whose backward is differentiable."""
    pair_on_tree = lambda x: log_pair(x, ctx.k)  # noqa: E731
    return torch.func.vjp(pair_on_tree, ctx.saved_tensors[0])[1](grad_pair)[0], None


def _esp_tangent(ctx, tangent_x, *unused):
    """Forward mode: each of the pair's tangents is its gradient (one backward launch each) dotted with ``x``'s."""
    if tangent_x is None:
        return None, None, None
    x, prefix, complement, pair = ctx.saved_tensors
    unit = torch.eye(2, dtype=pair.dtype, device=pair.device)
    gradients = [log_esp_pair_backward(x, prefix, complement, pair, unit[j].expand_as(pair), ctx.k) for j in (0, 1)]
    return torch.stack([(gradient * tangent_x).sum(-1) for gradient in gradients], -1), None, None


def _save_hinge(ctx, inputs, output):
    scores, labels, ctx.k, ctx.tau, ctx.alpha = inputs
    _save(ctx, scores, labels, *output[1:])
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # no zero gradients made for the saved outputs (the prefix is [rows, n, block])


def _hinge_gradient(ctx, grad_loss, *unused, backward):
    scores, labels, prefix, complement, pair, aux = ctx.saved_tensors
    return backward(scores, labels, prefix, complement, pair, aux, grad_loss, ctx.k, ctx.tau), None, None, None, None


def _differentiable_hinge_gradient(ctx, grad_loss, *unused):
    """Through the same loss on the tree, whose backward is differentiable."""
    scores, labels = ctx.saved_tensors[:2]
    loss_on_tree = lambda scores: smooth_hinge_tree(scores, labels, ctx.k, ctx.tau, ctx.alpha)  # noqa: E731
    return torch.func.vjp(loss_on_tree, scores)[1](grad_loss)[0], None, None, None, None


def _hinge_tangent(ctx, tangent_scores, *unused):
    """Forward mode: the loss's gradient (one backward launch) dotted with the scores' tangent."""
    if tangent_scores is None:
        return (None,) * 5
    scores, labels, prefix, complement, pair, aux = ctx.saved_tensors
    gradient = smooth_hinge_rows_backward(scores, labels, prefix, complement, pair, aux,
                                          scores.new_ones(scores.shape[0]), ctx.k, ctx.tau)
    return (gradient * tangent_scores).sum(-1), None, None, None, None


class Autograd(NamedTuple):
    """A forward operator's derivatives."""

    setup_context: Callable  #: (ctx, inputs, output): saves what the formulas read
    gradient: Callable  #: (ctx, *grads, backward): the inputs' gradients, calling ``backward``
    backward: str  #: the backward operator (its name in :data:`SPECS`)
    differentiable_gradient: Callable  #: (ctx, *grads): the inputs' gradients in differentiable PyTorch operations
    tangent: Callable  #: (ctx, *tangents): forward mode, from the saved tensors


class Spec(NamedTuple):
    """An operator of the ``topk`` namespace."""

    computation: Callable  #: what it computes; its signature (annotations included) is the operator's schema
    fake: Callable  #: its outputs' shapes and dtypes
    batching: Callable  #: (operator, info, in_dims, *args): its batching rule (:mod:`topk._batching`)
    autograd: Optional[Autograd] = None  #: a forward operator's derivatives
    device_types: Optional[str] = None  #: the devices it runs on (default: any)


def _scatter_autograd(backward: str) -> Autograd:
    """The perturbed top-K's derivatives (Prop. 3.3, Eq. 12), its gradient written by the operator ``backward``."""
    return Autograd(_save_positions, _scatter_gradient, backward, _differentiable_scatter_gradient, _top_tangent)


#: The scatter's batching rule: the vmapped dimension in front of ``grad``'s and the labels', behind the positions'
#: samples.
_SCATTER_BATCHING = _batching.leading((0, 1, 0, None), 0)

#: Every operator of the ``topk`` namespace, by name.
SPECS = {
    "perturbed_top": Spec(
        _perturbed_top.perturbed_top, _perturbed_top_fake, _batching.leading((0, 1, None, None, None, 0), (0, 1)),
        _scatter_autograd("perturbed_top_backward")),
    "pruned_perturbed_top": Spec(
        _perturbed_top.pruned_perturbed_top, _pruned_perturbed_top_fake,
        _batching.leading((0, None, None, None, None, None, 0), (0, 1), seed=1),
        _scatter_autograd("perturbed_top_backward"), device_types="cpu"),
    "fused_perturbed_top": Spec(
        _perturbed_top.fused_perturbed_top, _fused_perturbed_top_fake,
        _batching.leading((0, None, 1, None, None, None, 0), (0, 1), seed=1),
        _scatter_autograd("fused_perturbed_top_backward")),
    "perturbed_top_backward": Spec(_perturbed_top.perturbed_top_backward, _scatter_fake, _SCATTER_BATCHING),
    "fused_perturbed_top_backward": Spec(_perturbed_top.fused_perturbed_top_backward, _scatter_fake, _SCATTER_BATCHING),
    "log_esp_pair": Spec(
        _esp_launch.log_esp_pair, _log_esp_pair_fake, _batching.rows,
        Autograd(_save_prefix, _esp_gradient, "log_esp_pair_backward", _differentiable_esp_gradient, _esp_tangent)),
    "log_esp_pair_backward": Spec(_esp_launch.log_esp_pair_backward, _log_esp_pair_backward_fake, _batching.rows),
    "smooth_hinge_rows": Spec(
        _esp_launch.smooth_hinge_rows, _smooth_hinge_rows_fake, _batching.rows,
        Autograd(_save_hinge, _hinge_gradient, "smooth_hinge_rows_backward", _differentiable_hinge_gradient,
                 _hinge_tangent)),
    "smooth_hinge_rows_backward": Spec(_esp_launch.smooth_hinge_rows_backward, _smooth_hinge_rows_backward_fake,
                                       _batching.rows),
}


def _gradient(name: str, eager: bool) -> Callable:
    """The gradient formula of the forward operator ``name``, as autograd calls it: registered with the operator
    (``eager=False``) or called by :class:`_EagerCall` (``eager=True``)."""
    autograd = SPECS[name].autograd

    def gradient(ctx, *grads):
        if torch.is_grad_enabled():  # create_graph=True, or under torch.func: a backward that is itself differentiable
            return autograd.differentiable_gradient(ctx, *grads)
        if eager and not _transformed(grads):  # the backward's computation, without the operator's dispatch
            return autograd.gradient(ctx, *grads, backward=SPECS[autograd.backward].computation)
        return autograd.gradient(ctx, *grads, backward=OPERATORS[autograd.backward])

    return gradient


def _register(name: str, spec: Spec):
    operator = torch.library.custom_op(f"topk::{name}", spec.computation, mutates_args=(),
                                       device_types=spec.device_types)
    operator.register_fake(spec.fake)
    operator.register_vmap(functools.partial(spec.batching, operator))
    if spec.autograd is not None:
        operator.register_autograd(_gradient(name, eager=False), setup_context=spec.autograd.setup_context)
    return operator


#: The registered operators, by name.
OPERATORS = {name: _register(name, spec) for name, spec in SPECS.items()}
_NAMES = {operator: name for name, operator in OPERATORS.items()}

perturbed_top = OPERATORS["perturbed_top"]
pruned_perturbed_top = OPERATORS["pruned_perturbed_top"]
fused_perturbed_top = OPERATORS["fused_perturbed_top"]
perturbed_top_backward = OPERATORS["perturbed_top_backward"]
fused_perturbed_top_backward = OPERATORS["fused_perturbed_top_backward"]
log_esp_pair = OPERATORS["log_esp_pair"]
log_esp_pair_backward = OPERATORS["log_esp_pair_backward"]
smooth_hinge_rows = OPERATORS["smooth_hinge_rows"]
smooth_hinge_rows_backward = OPERATORS["smooth_hinge_rows_backward"]


class _EagerCall(torch.autograd.Function):
    """A forward operator's computation and gradient called directly: the operator without its dispatch (the custom
    operator's Python wrappers cost host time at every forward and backward). Its context is set apart from the
    forward and it has a forward-mode formula and a batching rule, so that ``torch.func`` takes it."""

    @staticmethod
    def forward(name: str, *args):
        return SPECS[name].computation(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        name, *args = inputs
        SPECS[name].autograd.setup_context(ctx, args, output)
        ctx.operator_name = name

    @staticmethod
    def backward(ctx, *grads):
        return (None, *_EAGER_GRADIENTS[ctx.operator_name](ctx, *grads))

    @staticmethod
    def jvp(ctx, _, *tangents):
        """Forward mode (``torch.func.jvp``, ``jacfwd``, ``hessian``), from the tensors saved for the backward."""
        return SPECS[ctx.operator_name].autograd.tangent(ctx, *tangents)

    @staticmethod
    def vmap(info, in_dims, name, *args):
        """``torch.func.vmap``: the operator's batching rule."""
        return SPECS[name].batching(OPERATORS[name], info, in_dims[1:], *args)


_EAGER_GRADIENTS = {name: _gradient(name, eager=True) for name, spec in SPECS.items() if spec.autograd is not None}

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
    opaque node of the graph), in eager mode the same computation and gradient through :class:`_EagerCall`."""
    if _through_operators or torch.compiler.is_compiling():
        return operator(*args)
    return _EagerCall.apply(_NAMES[operator], *args)


def _transformed(args) -> bool:
    """Whether a tensor among ``args`` is wrapped by a ``torch.func`` transform (vmap needs the operators' batching
    rules)."""
    return any(isinstance(arg, Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(arg) for arg in args)
