"""What a session owns besides its managed models: every variable and model made in it.

TensorFlow Java's ``EagerSession`` owns every resource created while it is
current. The Python equivalent rests on two public hooks of the calling
thread: ``tf.variable_creator_scope``, which every ``tf.Variable`` passes
(Keras 3 variables on the TensorFlow backend, optimizer slots, raw variables of
a ``tf.Module``, variables made while a ``tf.function`` traces), and
``Model.__new__``, which every Keras model passes (``_recording.py``).

A :class:`Ledger` keeps weak references only: to each variable, to its handle
tensor, and to each model. When a variable object dies (the collector found
the model it belonged to) but its handle is still held, a traced graph
captured it, and the gradient registry or a reference cycle keeps that graph:
the ledger releases the buffer through the handle (mechanism A) and purges the
registry entries (mechanism B), so the bytes come back without waiting for
another collection. Closing releases every buffer still held, seals the plain
models (their entry points raise ``DisposedError``) and forgets all of it;
what was handed out (:meth:`Ledger.take`) moves to another ledger, or to
nobody.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

import attrs
import keras
import tensorflow as tf
from keras.src.backend.common import global_state
from tensorflow.python.framework import ops
from tensorflow.python.ops import stateful_random_ops

from . import _keras, _purge, _recording, _release, _resources
from ._internal import internal

__all__ = ["Ledger", "LedgerEntries"]

# The ledgers with a scope open on each thread, innermost last.
_active = threading.local()
# Guards the installation of the reset hook; TensorFlow's own function once installed.
_hook_lock = threading.Lock()
_original_reset: Any = None


def _install_reset_hook() -> None:
    """Have the thread's ledgers record again after its default graph is reset.

    ``keras.backend.clear_session()`` calls ``tf.compat.v1.reset_default_graph()``,
    which gives the calling thread a new default graph, and the variable
    creators of the old one go with it: a daily loop that clears its session
    and then builds only raw ``tf.Variable`` objects would be missed from its
    second day on. TensorFlow has no hook for it, so the function is wrapped,
    once; it acts only on threads where a ledger's scope is open.

    Raises:
        CompatibilityError: TensorFlow no longer has the function.
    """
    global _original_reset
    with _hook_lock:
        if _original_reset is not None:
            return
        v1 = tf.compat.v1
        original = internal(v1, "reset_default_graph", "tf.compat.v1.reset_default_graph")

        @functools.wraps(original)
        def reset_default_graph() -> None:
            original()
            for ledger in getattr(_active, "ledgers", ()):
                ledger.ensure_recording()

        v1.reset_default_graph = reset_default_graph
        _original_reset = original


@attrs.define(eq=False, slots=True)
class _Buffer:
    """One buffer the ledger owns: weak references to its variable and handle."""

    variable: weakref.ReferenceType[Any]
    handle: weakref.ReferenceType[Any]
    dtype: tf.DType
    device: str
    nbytes: int


@attrs.define(eq=False)
class LedgerEntries:
    """Buffers and models taken out of one ledger, to be put into another."""

    buffers: dict[int, _Buffer] = attrs.field(factory=dict)
    models: dict[int, weakref.ReferenceType[keras.Model]] = attrs.field(factory=dict)


# Bytes of variables no model claims (a tf.Module's) reported to the cleaner
# at once, as bytes of no owner (byte pressure).
_UNCLAIMED_CHUNK = 16 * 2**20


def _is_plain(model: keras.Model | None) -> bool:
    """Alive, neither managed (its session disposes it) nor sealed already."""
    return (
        model is not None
        and not hasattr(model, "_lifecycle")
        and not isinstance(model, _keras.ClosedModel)
    )


class Ledger:
    """The variables and plain Keras models made on threads where its session is current.

    Args:
        name: The owning session's name, for messages.
        allocated: Told ``(bytes, owner)`` for the buffers created (the
            cleaner's byte pressure): the owner is the plain model built last
            on that thread, or ``None`` for variables no model claims.
        dead: Called, without any lock, when a variable the ledger owns was
            collected: the owner queues :meth:`sweep` where its strategy runs
            work. It may run inside the garbage collector, on any thread.
    """

    def __init__(
        self,
        name: str,
        allocated: Callable[[int, Hashable | None], None],
        dead: Callable[[], None],
    ) -> None:
        self.name = name
        self._allocated = allocated
        self._dead_callback = dead
        # Guards _buffers, _models and the counters.
        self._lock = threading.Lock()
        # id(variable) -> buffer; the ids are held as long as the variable lives.
        self._buffers: dict[int, _Buffer] = {}
        self._models: dict[int, weakref.ReferenceType[keras.Model]] = {}
        # ids of variables the collector freed; put() is safe inside the collector.
        self._dead: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._sweep_queued = False
        # Per thread: the owner that variables created now count for.
        self._thread = threading.local()
        self._open = True
        self.buffers_released = 0
        self.bytes_released = 0

    # -- recording -------------------------------------------------------------

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Own what the calling thread creates inside the block."""
        installed = getattr(self._thread, "installed", None)
        if installed is None:
            installed = self._thread.installed = []
        depth = len(installed)
        _install_reset_hook()
        self._install()
        ledgers = getattr(_active, "ledgers", ())
        _active.ledgers = (*ledgers, self)
        try:
            with _recording.observe_thread_models(self._note_model):
                yield
        finally:
            _active.ledgers = tuple(ledger for ledger in _active.ledgers if ledger is not self)
            # Exit what this block installed, the re-installations included.
            while len(installed) > depth:
                _, creator_scope = installed.pop()
                # Exited on the graph it was entered on; a misnested exit is the caller's to report.
                with contextlib.suppress(RuntimeError):
                    creator_scope.__exit__(None, None, None)

    def _install(self) -> None:
        """Put the ledger's creator on the calling thread's creator stack."""
        creator_scope = tf.variable_creator_scope(self._create)
        creator_scope.__enter__()
        self._thread.installed.append((ops.get_default_graph(), creator_scope))

    def ensure_recording(self) -> None:
        """Record again on this thread if its default graph was replaced.

        ``keras.backend.clear_session()`` (``tf.compat.v1.reset_default_graph()``)
        replaces TensorFlow's default graph of the calling thread, and the
        variable creators with it. Called right after such a reset, and when a
        Keras model is built or an explicit safe point is reached.
        """
        installed = getattr(self._thread, "installed", None)
        graph = ops.get_default_graph()
        # Inside a trace the default graph is the function's, not the thread's.
        if installed and installed[-1][0] is not graph and not graph.building_function:
            self._install()

    def _create(self, next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        variable = next_creator(**kwargs)
        if self._open:
            self.add([variable])
        return variable

    def _note_model(self, model: keras.Model) -> None:
        if not self._open:
            return
        self.ensure_recording()
        ref = weakref.ref(model)
        with self._lock:
            self._models[id(model)] = ref
        # The variables made from now on count for this model (byte pressure).
        self._thread.group = (id(model), ref)

    def stop_recording(self) -> None:
        """Own nothing new from now on (the session is closing)."""
        self._open = False

    def resume_recording(self) -> None:
        """Own what is made again (a close failed; the session stays open)."""
        self._open = True

    def add(self, variables: Iterable[Any]) -> None:
        """Own the buffers behind ``variables`` (any variable, distributed ones too)."""
        total = 0
        with self._lock:
            for leaf in _resources.variable_leaves(variables):
                if id(leaf) in self._buffers:
                    continue
                nbytes = _resources.leaf_nbytes(leaf)
                key = id(leaf)
                self._buffers[key] = _Buffer(
                    variable=weakref.ref(leaf, self._died(key)),
                    handle=weakref.ref(leaf.handle),
                    dtype=leaf.dtype,
                    device=leaf.device,
                    nbytes=nbytes,
                )
                total += nbytes
        self._account(total)

    def _account(self, nbytes: int) -> None:
        """Tell the session's cleaner about new bytes, once, as the model's they are.

        A functional model's layers make their variables before the model
        exists: bytes made before any model on this thread wait, unclaimed,
        for the next model, which is known to be managed or not by its first
        variable. A managed model's bytes are its record's to count. Variables
        no model claims (a ``tf.Module``'s) count as owned by nobody, in
        chunks.
        """
        thread = self._thread
        unclaimed = getattr(thread, "unclaimed", 0) + nbytes
        group = getattr(thread, "group", None)
        if group is None:
            if unclaimed >= _UNCLAIMED_CHUNK:
                self._allocated(unclaimed, None)
                unclaimed = 0
            thread.unclaimed = unclaimed
            return
        thread.unclaimed = 0
        key, ref = group
        model = ref()
        if model is not None and not hasattr(model, "_lifecycle"):
            self._allocated(unclaimed, ("model", key))

    def _died(self, key: int) -> Callable[[Any], None]:
        dead, ledger = self._dead, weakref.ref(self)

        def died(_: Any) -> None:
            # Inside the collector, on any thread: no lock, only a queue.
            dead.put(key)
            owner = ledger()
            if owner is not None and not owner._sweep_queued:
                owner._sweep_queued = True
                owner._dead_callback()

        return died

    def discard(self, variables: Iterable[Any]) -> None:
        """Stop owning buffers a dispose already released (``variables``: their leaves)."""
        with self._lock:
            for leaf in variables:
                self._buffers.pop(id(leaf), None)

    # -- statistics --------------------------------------------------------------

    def released(self) -> tuple[int, int]:
        """``(buffers, bytes)`` the ledger released so far."""
        with self._lock:
            return self.buffers_released, self.bytes_released

    def counts(self) -> tuple[int, int, int]:
        """``(buffers, bytes, models)`` owned now (models: plain ones still alive)."""
        with self._lock:
            buffers = list(self._buffers.values())
            models = sum(_is_plain(ref()) for ref in self._models.values())
        return len(buffers), sum(b.nbytes for b in buffers), models

    # -- freeing -----------------------------------------------------------------

    def sweep(self) -> int:
        """Free the buffers of variables the collector found; returns the bytes freed.

        Their handles may still be held by traced graphs (pinned by the
        gradient registry, or in reference cycles): the buffers are released
        through them and the registry entries purged.
        """
        self._sweep_queued = False
        gone: list[_Buffer] = []
        with self._lock:
            while True:
                try:
                    key = self._dead.get_nowait()
                except queue.Empty:
                    break
                buffer = self._buffers.pop(key, None)
                if buffer is not None:
                    gone.append(buffer)
            for key, ref in list(self._models.items()):
                if ref() is None:
                    del self._models[key]
        return self._free(gone)

    def _free(self, buffers: Iterable[_Buffer]) -> int:
        """Release the buffers whose handles are still held; purge what pins them."""
        held = [
            (handle, buffer.dtype, buffer.device, buffer.nbytes)
            for buffer in buffers
            if (handle := buffer.handle()) is not None
        ]
        if not held:
            return 0
        per_device = _release.release_handles(held)
        _purge.purge_gradient_registry(handle for handle, *_ in held)
        nbytes = sum(n for n, _ in per_device.values())
        with self._lock:
            self.buffers_released += len(held)
            self.bytes_released += nbytes
        return nbytes

    def close(self) -> tuple[int, int]:
        """Seal the plain models, release every buffer still held, own nothing more.

        Keras's and TensorFlow's per-process random generators, if they were
        first made here, are kept: they are the thread's and the process's, not
        the session's.

        Returns:
            ``(buffers, bytes)`` released by the close.
        """
        self._open = False
        self.sweep()
        self._keep_global_generators()
        with self._lock:
            buffers, self._buffers = self._buffers, {}
            models, self._models = self._models, {}
        detached: list[Any] = []
        for ref in models.values():
            model = ref()
            # A managed model is its session's to dispose; a sealed one is done.
            if (
                model is None
                or hasattr(model, "_lifecycle")
                or isinstance(model, _keras.ClosedModel)
            ):
                continue
            detached.extend(_keras.seal(model, self.name))
            del model
        before = self.buffers_released, self.bytes_released
        self._free(buffers.values())
        detached.clear()
        return self.buffers_released - before[0], self.bytes_released - before[1]

    def _keep_global_generators(self) -> None:
        generators = [
            internal(stateful_random_ops, "global_generator", "tf.random global_generator"),
            global_state.get_global_attribute("global_seed_generator"),
        ]
        kept: list[Any] = []
        for generator in generators:
            state = getattr(generator, "state", None)
            if state is not None:
                kept.append(state)
        if kept:
            self.take(kept)

    # -- handing out -------------------------------------------------------------

    def take(self, objects: Iterable[Any]) -> LedgerEntries:
        """Stop owning ``objects`` and what they hold; returns the entries taken.

        Args:
            objects: Keras models, layers, optimizers, ``tf.Module`` objects and
                variables.

        Raises:
            TypeError: An object is none of these.
        """
        objects = list(objects)
        variables: list[Any] = []
        models: list[int] = []
        for obj in objects:
            variables.extend(_resources.object_variables(obj))
            if isinstance(obj, keras.Model):
                models.append(id(obj))
        leaves = _resources.variable_leaves(variables)
        taken = LedgerEntries()
        with self._lock:
            for leaf in leaves:
                buffer = self._buffers.pop(id(leaf), None)
                if buffer is not None:
                    taken.buffers[id(leaf)] = buffer
            for key in models:
                ref = self._models.pop(key, None)
                if ref is not None:
                    taken.models[key] = ref
        return taken

    def put(self, entries: LedgerEntries) -> None:
        """Own entries another ledger handed out (their variables still alive)."""
        with self._lock:
            for buffer in entries.buffers.values():
                leaf = buffer.variable()
                if leaf is None:
                    continue
                key = id(leaf)
                # A fresh weak reference: the old one's callback tells the old ledger.
                self._buffers[key] = attrs.evolve(
                    buffer, variable=weakref.ref(leaf, self._died(key))
                )
                del leaf
            for key, ref in entries.models.items():
                if ref() is not None:
                    self._models[key] = ref


def self_check() -> None:
    """The creators see every kind of variable, after a reset of the graph too.

    A dead variable's pinned buffer is freed. The reset is the thread's own
    ``tf.compat.v1.reset_default_graph()`` (what ``keras.backend.clear_session()``
    calls, which is not called here: it would reset every thread's Keras state).
    """
    died: list[bool] = []
    ledger = Ledger("self-check", allocated=lambda *_: None, dead=lambda: died.append(True))

    class Module(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(tf.ones((4,)))
            self.layer = keras.layers.Dense(1)

    with ledger.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD()
        module = Module()
        # Held by the list only: the traced step captures its handle, not the variable.
        holder = [tf.Variable(tf.ones((3,)))]

        @tf.function
        def step() -> Any:
            return holder[0] * 2.0

        step()
    buffers, _, models = ledger.counts()
    # Dense kernel and bias, SGD's iteration count and learning rate, w, raw.
    assert (buffers, models) == (6, 1), (buffers, models)
    found = _resources.object_variables(module)
    assert len(found) == 1 and found[0] is module.w, found
    assert len(_resources.object_variables(optimizer)) == 2
    handle = holder[0].handle
    holder.clear()
    assert died, "a ledger's variable died unnoticed"
    assert ledger.sweep() == 12 and ledger.released() == (1, 12)
    with tf.init_scope():
        value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)
    assert value.shape == (0,), f"a dead variable's pinned buffer was not freed: {value.shape}"
    del step, handle, value
    internal(stateful_random_ops, "global_generator", "tf.random global_generator")
    internal(global_state, "get_global_attribute", "keras global_state.get_global_attribute")
    assert ledger.counts()[0] == buffers - 1, ledger.counts()
    with ledger.scope():
        tf.compat.v1.reset_default_graph()  # this thread's graph only
        tf.Variable(1.0)
    assert ledger.counts()[0] == buffers, "a variable made after a graph reset was missed"
    ledger.close()
    assert _resources.object_variables(model)[0].numpy().shape == (0,)
