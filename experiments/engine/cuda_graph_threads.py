"""The CUDA-graph trees of inductor's ``reduce-overhead`` and ``max-autotune`` steps for a thread that trains.

torch 2.11 makes the trees' containers only for the thread that imported inductor (and hands them to the autograd
threads its steps reach): a compiled step first run by another thread failed with an ``AssertionError`` in
``cudagraph_trees.get_obj`` (H200, ``benchmarks/NOTES.md`` section 20). Later versions make them on first use. A
thread that will train calls :func:`give_this_thread_cuda_graph_trees` first.
"""

from __future__ import annotations

import collections
import ctypes
import sys
import threading

import torch

#: The thread-local attributes of ``torch._inductor.cudagraph_trees.local`` that a thread's trees live in.
TREE_STATE = ("tree_manager_containers", "tree_manager_locks")


def give_this_thread_cuda_graph_trees() -> None:
    """The calling thread's own (empty) tree containers, also where autograd's threads running its backward passes
    look for them; nothing where the thread has them already, or where torch sees no GPU (which spares a CPU's
    threads inductor's import)."""
    if not torch.cuda.is_available():
        return
    from torch._inductor import cudagraph_trees

    if all(hasattr(cudagraph_trees.local, name) for name in TREE_STATE):
        return
    fresh = {"tree_manager_containers": {}, "tree_manager_locks": collections.defaultdict(threading.Lock)}
    for name in TREE_STATE:
        setattr(cudagraph_trees.local, name, fresh[name])
        _stash_in_torch_thread_state(name, fresh[name])


def _stash_in_torch_thread_state(name: str, value: object) -> None:
    """``value``, a fresh object no other thread holds yet, in the calling thread's torch state, which autograd's
    threads receive, holding a reference of its own (the count is read before and after the stash).

    torch 2.11's ``_stash_obj_in_tls`` keeps the pointer it is handed without counting a reference (its
    ``c10::SafePyObject`` takes one over) and gives one back when the thread's state ends: at a thread's end ``value``
    was released twice, by ``threading.local`` and by the stash, the likeliest cause of the crash that ended the sixth
    H200 lease's thread test (NOTES section 27). torch 2.14 counts the stash's reference; where it did not, we do."""
    before = sys.getrefcount(value)
    torch._C._stash_obj_in_tls(name, value)
    if sys.getrefcount(value) == before:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(value))
