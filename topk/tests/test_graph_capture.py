"""Every loss of Table 1 is a first-class PyTorch citizen: nothing read on the host, few dispatched ops, one graph
under ``torch.compile(fullgraph=True)`` that matches eager, custom operators that pass ``torch.library.opcheck``,
and, on a GPU, CUDA-graph replays that draw fresh noise."""

import contextlib
import shutil
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import topk
from topk import _ops, fused, losses
from topk.losses import LOSSES, build_loss

L, BATCH, N_SAMPLES = 12, 6, 4

#: Every loss of Table 1 built from the registry, with the paper's kind of hyperparameters.
TABLE_1 = {
    "zero_one": {"k": 2},
    "cross_entropy": {},
    "ldam": {"class_counts": list(range(1, L + 1)), "max_margin": 0.5, "scale": 3.0},
    "focal": {"gamma": 2.0},
    "lapin_hinge": {"k": 2},
    "convex_hinge": {"k": 2},
    "calibrated_hinge": {"k": 2},
    "smooth_hinge": {"k": 3, "tau": 1.0},
    "noised_balanced": {"k": 2, "epsilon": 0.5, "n_samples": N_SAMPLES},
    "noised_imbalanced": {"k": 2, "epsilon": 0.5, "n_samples": N_SAMPLES, "class_counts": list(range(1, L + 1)),
                          "max_margin": 0.5, "scale": 50.0},
}

#: aten operators that read a tensor's values on the host (a device synchronisation on a GPU).
HOST_READS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "equal", "allclose", "masked_select", "_unique",
              "_unique2", "unique_dim", "unique_consecutive", "bincount", "histc"}


class DispatchTrace(TorchDispatchMode):
    """The operators dispatched below autograd, eager calls going through the registered operators (a custom operator
    counts once, whatever it runs inside: its inside is tested where it runs, on the device)."""

    def __init__(self):
        super().__init__()
        self.ops = []
        self._operators = _ops.through_operators()

    def __enter__(self):
        self._operators.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._operators.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))

    def host_reads(self):
        return [str(op) for op in self.ops if op.__name__.split(".")[0] in HOST_READS]


def _scores_and_labels(seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, L, generator=generator, dtype=dtype), torch.randint(0, L, (BATCH,), generator=generator)


def test_table_1_is_covered():
    assert set(TABLE_1) == set(LOSSES)


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_no_loss_reads_tensor_values_on_the_host(name):
    """Forward and backward of every loss (and of the smoothed operators) dispatch no operator that reads values on
    the host: on a GPU, none waits for the device."""
    loss = build_loss(name, **TABLE_1[name])
    s, y = _scores_and_labels()
    s.requires_grad_(name != "zero_one")
    with DispatchTrace() as trace:
        value = loss(s, y)
        if value.requires_grad:
            value.backward()
    assert trace.ops and trace.host_reads() == []


@pytest.mark.parametrize("operator", [topk.smooth_top_k, topk.smooth_top_sum_k])
def test_smoothed_operators_read_nothing_on_the_host(operator):
    s = torch.randn(BATCH, L, requires_grad=True)
    with DispatchTrace() as trace:
        operator(s, 3, 0.5, N_SAMPLES).sum().backward()
    assert trace.host_reads() == []


def test_a_host_read_would_be_seen():
    """The trace above can fail: ``F.one_hot`` reads the labels' range on the host, and is caught."""
    s, y = _scores_and_labels()
    with DispatchTrace() as trace:
        torch.nn.functional.one_hot(y, L)
    assert trace.host_reads()


@pytest.mark.parametrize("margins, most", [("balanced", 24), ("imbalanced", 28)])
def test_noised_loss_forward_and_backward_dispatch_at_most_24_ops_28_with_per_class_margins(margins, most):
    """The noised hinge's forward + backward (mean reduction) on the PyTorch path: label check, noise, one custom
    operator forward and one backward, the hinge and the reduction; per-class margins add their check (four
    operators, as the labels')."""
    loss = build_loss(f"noised_{margins}", **TABLE_1[f"noised_{margins}"])
    s, y = _scores_and_labels()
    s.requires_grad_()
    loss(s, y).backward()  # the first call allocates the noise buffer
    with DispatchTrace() as trace:
        loss(s, y).backward()
    assert len(trace.ops) <= most, [str(op) for op in trace.ops]


def _inductor_available():
    return shutil.which("g++") is not None or shutil.which("c++") is not None


#: The losses that run this package's registered operators: inductor lowers them too (on a CPU into C++, compiled
#: afresh for each new install of torch). The others are PyTorch's own operators, whose lowering is PyTorch's to test;
#: aot_eager captures every loss.
ON_OUR_OPERATORS = ("smooth_hinge", "noised_balanced", "noised_imbalanced")
LOSS_AND_COMPILER = [(name, "aot_eager") for name in sorted(TABLE_1)] + [
    pytest.param(name, "inductor", marks=pytest.mark.skipif(not _inductor_available(),
                                                            reason="inductor on a CPU needs a C++ compiler"))
    for name in ON_OUR_OPERATORS]


@pytest.mark.parametrize("name, compiler", LOSS_AND_COMPILER)
def test_a_training_step_compiles_as_one_graph_and_matches_eager(name, compiler):
    """``torch.compile(fullgraph=True)`` of model + loss (its backward compiled with it) for every loss of Table 1:
    no graph break, no recompilation over three batches, and the loss and the weights' gradients of eager mode (the
    noised losses given the noise)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, L))
    loss = build_loss(name, **TABLE_1[name])
    noised = name.startswith("noised")

    def step(x, y, noise):
        scores = model(x)
        if noised:
            return losses.noised_hinge(scores, y, loss.k, loss.epsilon, loss.n_samples, margins=loss.margins,
                                       scale=loss.scale, noise=noise)
        return loss(scores, y)

    compiled = torch.compile(step, fullgraph=True, backend=compiler)
    generator = torch.Generator().manual_seed(1)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            x, y = torch.randn(BATCH, 8, generator=generator), torch.randint(0, L, (BATCH,), generator=generator)
            noise = torch.randn(N_SAMPLES, BATCH, L, generator=generator)
            results = []
            for function in (step, compiled):
                model.zero_grad()
                value = function(x, y, noise)
                if name != "zero_one":
                    value.backward()
                results.append((value.detach(), [p.grad for p in model.parameters()]))
            (eager, eager_grads), (graph, graph_grads) = results
            torch.testing.assert_close(graph, eager, rtol=1e-5, atol=1e-6)
            for a, b in zip(graph_grads, eager_grads):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


#: The losses with a Triton kernel, built for a backend.
KERNEL_LOSSES = pytest.mark.parametrize(
    "make_loss", [lambda backend: losses.NoisedHinge(2, 0.5, N_SAMPLES, backend=backend),
                  lambda backend: losses.SmoothHinge(3, 1.0, backend=backend)], ids=["noised_hinge", "smooth_hinge"])


def _dynamic_batches_match_eager(loss, device=torch.device("cpu")):
    """``loss`` compiled with ``dynamic=True`` (symbolic shapes, and its float hyperparameters symbolic too) gives the
    eager loss and gradient over batches of 6, 5 and 9 rows from the same seed, compiled once."""
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager", dynamic=True)
    generator = torch.Generator().manual_seed(4)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in (6, 5, 9):
            s = torch.randn(batch, L, generator=generator).to(device)
            y = torch.randint(0, L, (batch,), generator=generator).to(device)
            results = []
            for function in (loss, compiled):
                scores = s.clone().requires_grad_()
                torch.manual_seed(3)
                value = function(scores, y)
                grad = torch.autograd.grad(value, scores)[0] if value.requires_grad else None
                results.append((value.detach(), grad))
            for graph, eager in zip(results[1], results[0]):
                torch.testing.assert_close(graph, eager, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_every_loss_compiles_with_dynamic_shapes_and_matches_eager(name):
    """``torch.compile(dynamic=True)``, as for batches of varying size: no graph break (a check of a float
    hyperparameter with ``math.isfinite`` broke the graph of 7 losses), no recompilation, eager's values."""
    torch._dynamo.reset()
    _dynamic_batches_match_eager(build_loss(name, **TABLE_1[name]))


@KERNEL_LOSSES
def test_the_kernel_backends_compile_with_dynamic_shapes(make_loss, kernel_device):
    torch._dynamo.reset()
    _dynamic_batches_match_eager(make_loss("triton"), kernel_device)


def test_compiled_noised_loss_draws_the_eager_noise_from_the_same_seed():
    """With the noise drawn inside the compiled graph (``torch.randn`` on the default generator), the same seed gives
    eager's loss (inductor keeps PyTorch's random stream with ``fallback_random``)."""
    s, y = _scores_and_labels()
    loss = losses.NoisedHinge(2, 0.5, N_SAMPLES)
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    torch.manual_seed(5)
    eager = loss(s, y)
    torch.manual_seed(5)
    assert torch.equal(compiled(s, y), eager)
    assert not torch.equal(compiled(s, y), eager)  # the next call draws new noise
    torch._dynamo.reset()


def _operator_samples():
    """Arguments of each custom operator: 3-d scores, with and without labels, both reductions."""
    generator = torch.Generator().manual_seed(2)
    s = torch.randn(3, 2, 9, dtype=torch.float64, generator=generator)
    noise = torch.randn(4, 3, 2, 9, dtype=torch.float64, generator=generator)
    y = torch.randint(0, 9, (3, 2), generator=generator)
    return s, noise, y


@pytest.mark.parametrize("sum_top, with_labels", [(False, False), (True, False), (False, True)])
def test_perturbed_top_operator_passes_opcheck(sum_top, with_labels):
    s, noise, y = _operator_samples()
    torch.library.opcheck(_ops.perturbed_top, (s.requires_grad_(), noise, 3, 0.7, sum_top, y if with_labels else None))


@pytest.mark.parametrize("sum_top, with_labels", [(False, False), (True, False), (False, True)])
def test_pruned_operator_passes_opcheck(sum_top, with_labels):
    s, _, y = _operator_samples()
    seed = torch.tensor([5])
    torch.library.opcheck(_ops.pruned_perturbed_top, (10 * s.requires_grad_(), seed, 3, 0.2, 4, sum_top,
                                                      y if with_labels else None))


def test_backward_operator_passes_opcheck():
    s, noise, y = _operator_samples()
    _, positions = _ops.perturbed_top(s, noise, 3, 0.7, True, None)
    torch.library.opcheck(_ops.perturbed_top_backward, (torch.randn(3, 2, dtype=torch.float64), positions, y, 9))


@pytest.mark.parametrize("with_noise", [False, True])
def test_fused_operator_passes_opcheck(with_noise):
    pytest.importorskip("triton")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not fused.available():
        pytest.skip("no triton")
    s, noise, y = (t.to(device) for t in _operator_samples())
    seed = torch.tensor([3], device=device)
    args = (s.requires_grad_(), None if with_noise else seed, noise if with_noise else None, 3, 0.7, 4, y)
    torch.library.opcheck(_ops.fused_perturbed_top, args)
    _, positions = _ops.fused_perturbed_top(*args)
    torch.library.opcheck(_ops.fused_perturbed_top_backward, (torch.randn(3, 2, dtype=s.dtype, device=device),
                                                              positions, y, s.shape[-1]))


def _forward_calls(device):
    """(operator, arguments) for each forward operator with an eager direct path, on ``device``'s scores."""
    s, noise, y = (t.to(device) for t in _operator_samples())
    calls = {"perturbed_top": (_ops.perturbed_top, (s, noise, 3, 0.7, False, y)),
             "perturbed_top_sum": (_ops.perturbed_top, (s, noise, 3, 0.7, True, None))}
    if device.type == "cpu":
        calls["pruned_perturbed_top"] = (_ops.pruned_perturbed_top, (10 * s, torch.tensor([5]), 3, 0.2, 4, False, y))
    calls["fused_perturbed_top"] = (_ops.fused_perturbed_top, (s, torch.tensor([3], device=device), None, 3, 0.7, 4, y))
    rows, labels = s.reshape(-1, 9), y.reshape(-1)
    calls["smooth_hinge_rows"] = (_ops.smooth_hinge_rows, (rows, labels, 3, 0.5, 1.0))
    calls["log_esp_pair"] = (_ops.log_esp_pair, (rows, 3))
    return calls


@pytest.mark.parametrize("name", ["perturbed_top", "perturbed_top_sum", "pruned_perturbed_top", "fused_perturbed_top",
                                  "smooth_hinge_rows", "log_esp_pair"])
def test_eager_direct_calls_equal_the_operators_bit_for_bit(name, request):
    """In eager mode ``_ops.call`` runs an operator's implementation and gradient without its dispatch; through the
    registered operator (as ``torch.compile`` does) the outputs and the gradient are the same, bit for bit."""
    triton_operator = name in ("fused_perturbed_top", "smooth_hinge_rows", "log_esp_pair")
    device = request.getfixturevalue("kernel_device") if triton_operator else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    calls = _forward_calls(device)
    if name not in calls:
        pytest.skip(f"{name} runs on a CPU only")
    operator, args = calls[name]
    results = []
    for through_operators in (False, True):
        scores = args[0].detach().clone().requires_grad_()
        with _ops.through_operators() if through_operators else contextlib.nullcontext():
            outputs = _ops.call(operator, scores, *args[1:])
            (grad,) = torch.autograd.grad(outputs[0].square().sum(), scores)
        results.append((*[o.detach() for o in outputs], grad))
    for direct, registered in zip(*results):
        assert torch.equal(direct, registered)


def test_an_out_of_range_label_fails_loudly_when_compiled():
    """The labels' range check is an assertion inside the compiled graph: a bad label raises, never a wrong loss."""
    s, y = _scores_and_labels()
    compiled = torch.compile(losses.NoisedHinge(2, 0.5, N_SAMPLES), fullgraph=True, backend="aot_eager")
    compiled(s, y)
    with pytest.raises(RuntimeError, match=r"'y' should hold class indices in \[0, 11\]"):
        compiled(s, torch.full((BATCH,), L))
    torch._dynamo.reset()


@KERNEL_LOSSES
def test_the_kernel_backends_compile_without_a_dynamo_warning(make_loss, kernel_device):
    """Choosing the Triton kernel inside a compiled region (the default ``auto`` on CUDA) warns nothing: the backend
    checks are constants to Dynamo, not cached functions it traces through (it warns about those on every compile)."""
    torch._dynamo.reset()
    loss = make_loss("auto" if kernel_device.type == "cuda" else "triton")
    s, y = (t.to(kernel_device) for t in _scores_and_labels())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(loss, fullgraph=True, backend="aot_eager")(s.requires_grad_(), y).backward()
    assert [str(w.message) for w in caught if "_dynamo" in w.filename] == []
    torch._dynamo.reset()


# --- on a GPU -------------------------------------------------------------------------------------------------------

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not fused.available(), reason="no triton"))]


@cuda_only
@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_no_loss_synchronises_with_the_device(name):
    """``torch.cuda.set_sync_debug_mode("error")`` raises on any synchronising call: forward + backward of every
    loss passes through it (after a first call, which may compile the kernel)."""
    parameters = {key: value.cuda() if isinstance(value, torch.Tensor) else value for key, value in TABLE_1[name].items()}
    loss = build_loss(name, **parameters).cuda()
    s, y = (t.cuda() for t in _scores_and_labels())
    s.requires_grad_(name != "zero_one")
    for debug_mode in ("default", "error"):
        torch.cuda.set_sync_debug_mode(debug_mode)
        try:
            value = loss(s, y)
            if value.requires_grad:
                value.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")


@cuda_only
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_graph_replays_draw_fresh_noise(backend):
    """A captured noised loss draws new noise at every replay (the seed or the noise comes from the default CUDA
    generator, registered with the graph), and the same generator state gives the same loss, whether restored or
    seeded between replays (as ``experiments.engine.train.reseed_process`` seeds each DDP process at every epoch)."""
    s, y = (t.cuda() for t in _scores_and_labels())
    loss = losses.NoisedHinge(2, 0.5, N_SAMPLES, reduction="none", backend=backend)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        loss(s, y)  # warm-up: compiles the kernel outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = loss(s, y)
    graph.replay()
    first = captured.clone()
    graph.replay()
    assert not torch.equal(captured, first)
    state = torch.cuda.get_rng_state()
    graph.replay()
    again = captured.clone()
    torch.cuda.set_rng_state(state)
    graph.replay()
    assert torch.equal(captured, again)
    seeded = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        graph.replay()
        seeded.append(captured.clone())
    assert torch.equal(seeded[0], seeded[1]) and not torch.equal(seeded[0], seeded[2])


@cuda_only
@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce_overhead_training_step_runs_20_steps_without_recompiling(backend):
    """Model + noised loss + backward + SGD under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs): 20 steps,
    one graph, no recompilation, a finite loss. The gradients are set to None between steps (``zero_grad``'s default):
    a gradient kept and accumulated into would be a CUDA-graph output that the next replay overwrites."""
    torch._dynamo.reset()  # the compiled ``forward`` below shares its code object with the other parametrisation's
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 100)).cuda()
    loss = losses.NoisedHinge(5, 0.2, 10, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)

    @torch.compile(mode="reduce-overhead", fullgraph=True)
    def forward(x, y):
        return loss(model(x), y)

    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(20):
            x, y = torch.randn(64, 32, device="cuda"), torch.randint(0, 100, (64,), device="cuda")
            value = forward(x, y)
            value.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert torch.isfinite(value.detach()).item()
