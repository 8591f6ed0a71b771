"""K-fold: is training as fast with the library as with plain Keras?

A k-fold cross-validation loop as a user writes it: for each of ``--folds``
folds, build ``keras.applications.ResNet50(weights=None)`` at ``--input-size``
(10 classes), compile it (Adam 1e-3, sparse categorical crossentropy,
accuracy), ``fit`` it on the fold for ``--epochs`` in batches of ``--batch``,
``evaluate`` it on the held-out split and drop it:

    plain      ``del model``
    library    ``lc.manage(model)`` after ``compile``, ``model.dispose()`` before ``del``

``--samples`` random images (fixed seed), split by scikit-learn's ``KFold``
(``numpy.array_split`` without it: the same folds). No warm-up beyond the loop's
own, no ``gc.collect()``. A child reports the time per training step (total
``fit`` time over total steps), the steady step (median batch, each fold's first
batch left out, from a callback), the median fold and the whole loop, and for
the library the cleaner's collections, the longest, the time it held the
interpreter lock, and the models disposed. Target: library/plain step time at
most 1.02x.

Run (from the repository root, with the package installed; scikit-learn optional)::

    python benchmarks/kfold.py            # 3 rounds x 2 children, 5 folds each
    python benchmarks/kfold.py --quick
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import _harness
from _harness import Metric, Option

CLASSES = 10
SEED = 0
TARGET = 1.02  # the library's time per training step over plain's, at most


def steady_step_ms(batch_seconds: Sequence[Sequence[float]]) -> float | None:
    """The median batch time in ms, each fold's first batch (it traces) left out."""
    later = [seconds for fold in batch_seconds for seconds in fold[1:]]
    return 1000 * statistics.median(later) if later else None


def fold_splits(samples: int, folds: int) -> tuple[str, list[tuple[Any, Any]]]:
    """The splitter's name and each fold's (training, held-out) indices: ``KFold``'s, or numpy's."""
    import numpy as np

    indices = np.arange(samples)
    try:
        from sklearn.model_selection import KFold
    except ImportError:
        splits = [(np.setdiff1d(indices, test), test) for test in np.array_split(indices, folds)]
        return "numpy.array_split", splits
    return "sklearn KFold", list(KFold(n_splits=folds).split(indices))


def batch_timer() -> Any:
    """A Keras callback recording each training batch's seconds in ``seconds``."""
    import keras

    class BatchTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []
            self._started = 0.0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._started = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.seconds.append(time.perf_counter() - self._started)

    return BatchTimer()


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    # The plain child never imports the library.
    import keras
    import numpy as np

    managed = variant == "library"
    if managed:
        import lifecycle as lc

    rng = np.random.default_rng(SEED)
    side = args.input_size
    x = rng.random((args.samples, side, side, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=args.samples)
    fits, folds, steps, batches, accuracy, fold_steps = [], [], 0, [], [], []
    started = time.perf_counter()
    splitter, splits = fold_splits(args.samples, args.folds)
    for train, test in splits:
        timer, fold_started = batch_timer(), time.perf_counter()
        model = keras.applications.ResNet50(
            weights=None, input_shape=(side, side, 3), classes=CLASSES
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        model = lc.manage(model) if managed else model
        fit_started = time.perf_counter()
        model.fit(
            x[train],
            y[train],
            batch_size=args.batch,
            epochs=args.epochs,
            verbose=0,
            callbacks=[timer],
        )
        fits.append(time.perf_counter() - fit_started)
        scores = model.evaluate(x[test], y[test], batch_size=args.batch, verbose=0)
        accuracy.append(scores[1])
        if managed:
            model.dispose()
        del model
        folds.append(time.perf_counter() - fold_started)
        fold_steps.append(math.ceil(len(train) / args.batch) * args.epochs)
        steps += fold_steps[-1]
        batches.append(timer.seconds)
    result = {
        "step_ms": 1000 * sum(fits) / steps,
        "steady_step_ms": steady_step_ms(batches),
        "fold_s": statistics.median(folds),
        "total_s": time.perf_counter() - started,
        "fit_s": statistics.median(fits),
        "steps": steps,
        "first_batch_s": statistics.median(fold[0] for fold in batches if fold),
        "accuracy": statistics.median(accuracy),
        "splitter": splitter,
        # Per fold, in the JSON only: fit and fold seconds, steps, first batch, accuracy.
        "fit_s_per_fold": fits,
        "fold_s_per_fold": folds,
        "steps_per_fold": fold_steps,
        "first_batch_s_per_fold": [fold[0] for fold in batches if fold],
        "accuracy_per_fold": accuracy,
    }
    if managed:
        stats = lc.statistics(count_graphs=False)
        result["models_disposed"] = stats.models_disposed
        result["collections"] = stats.collections
        result["max_collection_ms"] = 1000 * stats.max_collection_seconds
        result["blocking_ms"] = 1000 * stats.blocking_seconds
    return result


def target(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    lines = []
    for key in ("step_ms", "steady_step_ms"):
        found = _harness.ratio_over_rounds(runs, key, "library", "plain")
        lines.append(_harness.judge(f"{key} library/plain <= {TARGET:.2f}x", found, TARGET))
    splitters = {r["splitter"] for run in runs for r in run.values() if r}
    return [*lines, f"folds split by: {', '.join(sorted(splitters))}"]


def validate(args: argparse.Namespace) -> str | None:
    if args.folds < 2 or args.samples < args.folds:
        return f"--folds must be at least 2 and at most --samples; got {args.folds}"
    return None


BENCHMARK = _harness.Benchmark(
    name="kfold",
    doc=__doc__,
    variants={"plain": "del model", "library": "lc.manage() + model.dispose()"},
    metrics=[
        Metric("step_ms", "ms", ".1f", "step ms"),
        Metric("steady_step_ms", "ms", ".1f", "steady step ms"),
        Metric("fold_s", "s", ".1f", "fold s", series="fold_s_per_fold"),
        Metric("fit_s", "s", ".1f", "fit s", series="fit_s_per_fold"),
        Metric("steps", "", ".0f", "steps", False, "steps_per_fold"),
        Metric("first_batch_s", "s", ".2f", "first batch s", series="first_batch_s_per_fold"),
        Metric("accuracy", "", ".3f", "accuracy", False, "accuracy_per_fold"),
        Metric("total_s", "s", ".1f", "total s"),
        Metric("models_disposed", "", ".0f", "disposed", ratio=False),
        Metric("collections", "", ".0f", "cleaner gcs", ratio=False),
        Metric("max_collection_ms", "ms", ".1f", "longest gc ms", ratio=False),
        Metric("blocking_ms", "ms", ".1f", "GIL held ms", ratio=False),
    ],
    measure=measure,
    options=[
        Option("--folds", 5, "folds (at least 2)"),
        Option("--epochs", 1, "epochs per fold", _harness.positive_int),
        Option("--batch", 16, "batch size", _harness.positive_int),
        Option("--samples", 640, "random samples in all", _harness.positive_int),
        Option("--input-size", 64, "image side of ResNet50", _harness.image_side),
    ],
    quick={"folds": 2, "samples": 64, "input_size": 32},
    timeout=1800.0,
    notes=target,
    validate=validate,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
