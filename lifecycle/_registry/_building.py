"""Building a version: from a source to a managed, restored, warmed-up model.

A version is built in a child session of the registry's, under fresh layer
names and the scopes ``name/v<version>`` (so its variables are
``name/v<version>/<layer>/...``, identical across versions), restored from a
checkpoint if asked, and its serving path traced and called once before any
request can reach it (on the requests of a SavedModel's TensorFlow Serving
warm-up file when it has one). A SavedModel's other signatures are served
too, through their own functions (not batched, not warmed up). A failed build
disposes whatever it made.
"""

from __future__ import annotations

import os
import time
import zipfile
from collections.abc import Callable
from typing import Any

import attrs
import keras
import tensorflow as tf

from .. import _tf
from .._checkpoints import restore_checkpoint
from .._core import CleanupStrategy
from .._core._batcher import BatchingPolicy
from .._model import manage
from .._serving import serving_function
from .._session import LifecycleSession
from ..errors import CheckpointError, LoadError
from ._batching import BatchedServe
from ._signature import signature_of, signature_of_function
from ._version_dirs import is_saved_model
from ._versions import LoadedVersion
from ._warmup_file import WarmupRequests, read_warmup_requests

__all__ = ["build_version", "factory_of", "warmup_of"]


def factory_of(source: Any, safe_mode: bool) -> tuple[Callable[[], keras.Model], int | None]:
    """A zero-argument factory for ``source``, and the bytes it will hold if known.

    Args:
        source: A zero-argument callable returning a Keras model, the path
            of a ``.keras`` file, or a SavedModel directory.
        safe_mode: Keras ``safe_mode`` for files.

    Raises:
        FileNotFoundError: ``source`` is a path that does not exist.
        TypeError: ``source`` is neither.
    """
    if callable(source):
        return source, None
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(path):
            if not is_saved_model(path):
                raise FileNotFoundError(
                    f"{path!r} is a directory without a complete SavedModel (saved_model.pb "
                    "and variables/variables.index): nothing was loaded."
                )

            def from_saved_model() -> keras.Model:
                return _tf.saved_model_to_keras(path)

            return from_saved_model, _variables_bytes(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No saved model at {path!r}: nothing was loaded.")

        def from_file() -> keras.Model:
            return keras.models.load_model(path, compile=False, safe_mode=safe_mode)

        return from_file, _weights_bytes(path)
    raise TypeError(
        "`source` must be a zero-argument callable returning a Keras model, the path "
        f"of a .keras file or a SavedModel directory. Received: {source!r}"
    )


def warmup_of(source: Any, name: str, version: int) -> WarmupRequests | None:
    """The requests of a SavedModel's TensorFlow Serving warm-up file, if ``source`` has one.

    Raises:
        LoadError: The file exists and cannot be read (``tensorflow-serving-api``
            missing, a record that is not a predict request); nothing was loaded.
    """
    if not isinstance(source, (str, os.PathLike)) or not os.path.isdir(source):
        return None
    try:
        return read_warmup_requests(os.fspath(source))
    except (ValueError, ImportError, tf.errors.OpError) as error:
        raise LoadError(
            f"Loading {name!r} version {version} failed in its warm-up file: "
            f"{type(error).__name__}: {error}. Nothing was loaded."
        ) from error


def build_version(
    parent: LifecycleSession,
    name: str,
    version: int,
    factory: Callable[[], keras.Model],
    *,
    warmup: Any,
    checkpoint: str | None,
    strict: bool,
    batching: BatchingPolicy | None = None,
) -> LoadedVersion:
    """Build, restore and warm up a version in a child session of ``parent``.

    With ``batching``, the version serves through a :class:`BatchedServe`,
    warmed up at each allowed batch size too.

    ``warmup`` is a sample input, :class:`WarmupRequests` (replayed in order,
    the serving signature fixed by the first), or ``None`` (zeros shaped like
    the model's inputs).

    Raises:
        CheckpointError: The checkpoint does not fit; the partial model was disposed.
        LoadError: The factory or the warm-up failed; the partial model was disposed.
    """
    session = LifecycleSession(
        cleanup=CleanupStrategy.ON_SESSION_CLOSE,
        name=f"{parent.name}/{name}/v{version}",
        parent=parent,
        clear_session=False,
    )
    loaded = LoadedVersion(name=name, version=version, session=session)
    started = time.perf_counter()
    stage = "factory"
    try:
        with session.activate(), _tf.isolated_names(name, f"v{version}"):
            model = factory()
            if not isinstance(model, keras.Model):
                raise TypeError(
                    f"the factory returned {type(model).__qualname__}, not a keras.Model"
                )
            model = manage(model, session=session)
            replay = warmup.samples if isinstance(warmup, WarmupRequests) else ()
            if replay:
                warmup = replay[0]
            sample = warmup if warmup is not None else _sample_from_inputs(model)
            if checkpoint is not None:
                if not model.built:
                    # A checkpoint restores only into variables that exist.
                    stage = "build"
                    if sample is None:
                        raise ValueError(
                            "the model is not built and does not know its inputs: pass "
                            "warmup=<a sample input> to build it before the restore"
                        )
                    model(sample)
                stage = "checkpoint restore"
                restore_checkpoint(model, checkpoint, strict=strict)
            stage = "warm-up"
            if sample is None:
                raise ValueError("the model does not know its inputs: pass warmup=<a sample input>")
            serve = serving_function(model, _specs(sample))
            for request in replay or (sample,):
                serve(request)
            signature = signature_of(serve, _input_names(model))
            others = {}
            saved_signatures = _tf.saved_signatures(model)
            for saved in saved_signatures.values():
                if saved.name == _tf.SERVING_SIGNATURE:
                    signature = attrs.evolve(signature, method_name=saved.method_name)
                else:
                    others[saved.name] = (
                        signature_of_function(saved.function, saved.method_name),
                        _keywords(saved.function),
                    )
            if batching is not None:
                serve = BatchedServe(serve, batching)
                serve.warm_up(sample)
    except CheckpointError:
        session.close()
        raise
    except Exception as error:
        session.close()
        raise LoadError(
            f"Loading {name!r} version {version} failed in its {stage}: "
            f"{type(error).__name__}: {error}. The partial model was disposed."
        ) from error
    loaded.model, loaded.serve, loaded.signature = model, serve, signature
    loaded.others = others
    loaded.nbytes = model.owned_bytes
    if saved_signatures:
        # tf.saved_model.load's restored functions keep a copy of the variables,
        # in reference cycles: freed by a collection once the version is gone.
        loaded.collectable_bytes = loaded.nbytes
    loaded.load_seconds = time.perf_counter() - started
    return loaded


def _keywords(function: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    """A call of a signature's function on the dict its signature feeds (inputs as keywords)."""

    def call(inputs: dict[str, Any]) -> Any:
        return function(**inputs)

    return call


def _weights_bytes(path: str) -> int | None:
    """The size of a ``.keras`` archive's weights, read before loading it."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.getinfo("model.weights.h5").file_size
    except (KeyError, zipfile.BadZipFile):
        return None


def _variables_bytes(path: str) -> int | None:
    """The size of a SavedModel's variables on disk, read before loading it."""
    variables = os.path.join(path, "variables")
    try:
        return sum(
            entry.stat().st_size
            for entry in os.scandir(variables)
            if entry.name.startswith("variables.data-")
        )
    except OSError:
        return None


def _specs(sample: Any) -> Any:
    """A TensorSpec nest with a free batch dimension, from a sample input."""

    def spec(value: Any) -> tf.TensorSpec:
        tensor = tf.convert_to_tensor(value)
        return tf.TensorSpec([None, *tensor.shape[1:]], tensor.dtype)

    return tf.nest.map_structure(spec, sample)


def _input_names(model: keras.Model) -> list[str]:
    """The names of a model's inputs (``keras.Input(name=...)``), ``[]`` if it has none."""
    try:
        return [tensor.name for tensor in model.inputs or ()]
    except (AttributeError, ValueError):
        return []


def _sample_from_inputs(model: keras.Model) -> Any:
    """Zeros of batch 1 for a model that knows its inputs (functional, Sequential).

    Unknown dimensions are 1; a model whose inputs are a dict gets a dict.
    """
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not inputs:
        return None

    def zeros(tensor: Any) -> tf.Tensor:
        return tf.zeros([1, *(d or 1 for d in tensor.shape[1:])], tensor.dtype)

    try:
        structure = model.input
    except (AttributeError, ValueError):  # a Sequential never called has no `input`
        structure = None
    if isinstance(structure, dict):
        return {key: zeros(tensor) for key, tensor in structure.items()}
    samples = [zeros(tensor) for tensor in inputs]
    return samples[0] if len(samples) == 1 else samples
