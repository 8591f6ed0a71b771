"""The only code in keras-lifecycle that touches TensorFlow/Keras internals.

Everything the rest of the library needs from those internals is re-exported
here; ``check_compatibility()`` exercises each of them.
"""

from __future__ import annotations

try:
    from . import _checkpoint as checkpoint
    from . import _checkpoint_retention as checkpoint_retention
    from . import _keras as keras_internals
    from . import _memory as memory
    from . import _strategies as strategies
    from ._compat import CompatibilityReport, check_compatibility
    from ._functions import flat_call, omit_retracing_warning
    from ._keras import clear_session_preserving_caller_state
    from ._ledger import Ledger, LedgerEntries
    from ._naming import isolated_names
    from ._purge import (
        custom_gradient_entries,
        func_graphs,
        live_func_graphs,
        purge_gradient_registry,
    )
    from ._recording import (
        ModelRecorder,
        fresh_keras_thread_state,
        observe_thread_models,
        record_models,
    )
    from ._release import (
        is_released,
        release,
        release_by_device,
        release_handles,
        release_kernel_keys,
        warm_release,
    )
    from ._resources import (
        external_captures,
        keras_variables,
        leaf_nbytes,
        leaves,
        model_leaves,
        object_variables,
        variable_leaves,
    )
    from ._saved_model import (
        CLASSIFY_METHOD,
        PREDICT_METHOD,
        REGRESS_METHOD,
        SERVING_SIGNATURE,
        SavedSignature,
        saved_model_to_keras,
        saved_signatures,
    )
    from ._threads import capture_build_scope
except (ImportError, AttributeError) as exc:  # an internal module or name moved
    import keras as _keras_pkg
    import tensorflow as _tf_pkg

    from ..errors import CompatibilityError

    raise CompatibilityError(
        f"keras-lifecycle cannot work with TensorFlow {_tf_pkg.__version__} and Keras "
        f"{_keras_pkg.__version__}: importing an internal failed ({exc}). Install the "
        "versions pinned by keras-lifecycle or upgrade keras-lifecycle."
    ) from exc

__all__ = [
    "CLASSIFY_METHOD",
    "PREDICT_METHOD",
    "REGRESS_METHOD",
    "SERVING_SIGNATURE",
    "CompatibilityReport",
    "Ledger",
    "LedgerEntries",
    "ModelRecorder",
    "SavedSignature",
    "capture_build_scope",
    "check_compatibility",
    "checkpoint",
    "checkpoint_retention",
    "clear_session_preserving_caller_state",
    "custom_gradient_entries",
    "external_captures",
    "flat_call",
    "fresh_keras_thread_state",
    "func_graphs",
    "is_released",
    "isolated_names",
    "keras_internals",
    "keras_variables",
    "leaf_nbytes",
    "leaves",
    "live_func_graphs",
    "memory",
    "model_leaves",
    "object_variables",
    "observe_thread_models",
    "omit_retracing_warning",
    "purge_gradient_registry",
    "record_models",
    "release",
    "release_by_device",
    "release_handles",
    "release_kernel_keys",
    "saved_model_to_keras",
    "saved_signatures",
    "strategies",
    "variable_leaves",
    "warm_release",
]
