"""K-fold benchmark: is training as fast with the library as with plain Keras?

A k-fold cross-validation loop as a user writes it, once per variant: for each of
``--folds`` folds (5 by default), build ``keras.applications.ResNet50(weights=None,
input_shape=(S, S, 3), classes=10)`` (S = ``--input-size``, 64 by default), compile it
(Adam 1e-3, sparse categorical crossentropy, ``metrics=["accuracy"]``), ``fit`` it on
the fold's training split for ``--epochs`` epochs (1) in batches of ``--batch`` (16),
``verbose=0``, ``evaluate`` it on the held-out split, and drop it:

    plain      ``del model``
    library    ``model = lc.manage(model)`` after ``compile``, ``model.dispose()``
               before ``del model``; the default session (no session arguments)

The data are generated once per child with a fixed seed: ``--samples`` random
images (640 by default) and labels, split with scikit-learn's
``KFold(n_splits=folds)`` where scikit-learn is installed, else with
``numpy.array_split`` (the same folds: ``KFold`` without shuffling cuts the
samples in order, the first ``samples % folds`` folds one sample larger). Nothing
else runs: no warm-up beyond the loop's own (the first fold pays for TensorFlow's
start and the first tracing, in both variants), no ``gc.collect()``, no settling.

A child times, per fold, the ``fit`` call and the whole fold (build to drop), and
counts its training steps, ``ceil(training samples / batch) * epochs``. It reports:

* time per step: the folds' total ``fit`` time over their total steps;
* steady step time: the median time of one training batch, from a callback's
  ``time.perf_counter()`` at ``on_train_batch_begin`` and ``on_train_batch_end``,
  leaving out each fold's first batch (which traces the training step). The
  callback is passed to ``fit`` in both variants; as any callback that has an
  ``on_train_batch_end``, it makes Keras run the batch-end callbacks on the
  training thread rather than on its callback thread pool;
* the median fold time and the loop's total time, the per-fold lists (fit and
  fold seconds, steps, first batch, held-out accuracy), and for ``library`` the
  cleaner's work from ``lc.statistics(count_graphs=False)``: collections, the
  longest one, the time it held the interpreter lock, models disposed.

The target: time per step with the library at most 1.02x plain's.

Rounds: ``--rounds`` rounds (3 by default), each running every variant in a fresh
child process (this script re-invoked with ``--variant``), the order rotating
between rounds (plain library, then library plain, ...). Each cell of the table
is the median over the rounds (min-max); the library/plain ratios are taken
within each round, where the machine's drift cancels, and reported as the
median of the per-round ratios (min-max). The parent exits non-zero if a child
fails or times out, and names the failed children.

Run (from the repository root, with the package installed; scikit-learn from
the ``dev`` or ``sklearn`` extras)::

    python benchmarks/kfold.py                         # 3 rounds x 2 children, 5 folds each
    python benchmarks/kfold.py --rounds 1 --folds 2 --samples 64 --input-size 32   # quick
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import _harness

if TYPE_CHECKING:
    import numpy as np

VARIANTS = ("plain", "library")
REFERENCE = "plain"
CLASSES = 10
SEED = 0
LEARNING_RATE = 1e-3
# The target: the library's time per training step over plain's, at most.
TARGET = 1.02


# --------------------------------------------------------------------- pure helpers


def fold_sizes(samples: int, folds: int) -> list[tuple[int, int]]:
    """Each fold's (training, held-out) sample counts, as ``KFold`` cuts them.

    Args:
        samples: The number of samples.
        folds: The number of folds, at most ``samples``.

    Returns:
        One pair per fold: the first ``samples % folds`` folds hold out one
        sample more than the others.
    """
    held_out = [samples // folds + (1 if i < samples % folds else 0) for i in range(folds)]
    return [(samples - n, n) for n in held_out]


def steps_per_fold(train_samples: int, batch: int, epochs: int) -> int:
    """The training steps of a fold: ``ceil(train_samples / batch) * epochs``."""
    return math.ceil(train_samples / batch) * epochs


def steady_step_ms(batch_seconds: Sequence[Sequence[float]]) -> float | None:
    """The median batch time in ms, leaving out each fold's first batch (it traces).

    Args:
        batch_seconds: Per fold, the seconds of each training batch, in order.

    Returns:
        The median of every batch but each fold's first, in milliseconds; None
        if no fold had a second batch.
    """
    later = [seconds for fold in batch_seconds for seconds in fold[1:]]
    return 1000 * statistics.median(later) if later else None


# --------------------------------------------------------------------------- child


def make_data(samples: int, input_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Random images in [0, 1) and labels, the same in every child (fixed seed)."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    x = rng.random((samples, input_size, input_size, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=samples)
    return x, y


def fold_splits(samples: int, folds: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], str]:
    """The (training, held-out) index arrays of each fold, and what split them.

    Args:
        samples: The number of samples.
        folds: The number of folds, at least 2 and at most ``samples``.

    Returns:
        The folds, and ``"sklearn KFold"`` or ``"numpy array_split"``: scikit-learn's
        ``KFold(n_splits=folds)`` where it is installed, else the same folds cut
        with ``numpy.array_split``.
    """
    import numpy as np

    indices = np.arange(samples)
    try:
        from sklearn.model_selection import KFold
    except ImportError:
        held_out = np.array_split(indices, folds)
        splits = [(np.setdiff1d(indices, test), test) for test in held_out]
        return splits, "numpy array_split"
    return list(KFold(n_splits=folds).split(indices)), "sklearn KFold"


def batch_timer() -> Any:
    """A Keras callback that records each training batch's seconds, per ``fit`` call.

    Returns:
        The callback; its ``seconds`` list holds one entry per batch, from
        ``on_train_batch_begin`` to ``on_train_batch_end``.
    """
    import keras

    class BatchTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []
            self._started = 0.0

        def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self._started = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.seconds.append(time.perf_counter() - self._started)

    return BatchTimer()


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    # Imported here so the parent never loads TensorFlow; the plain child never
    # imports the library.
    import keras

    managed = variant == "library"
    if managed:
        import lifecycle as lc

    x, y = make_data(args.samples, args.input_size)
    splits, splitter = fold_splits(args.samples, args.folds)
    side = args.input_size
    fit_seconds: list[float] = []
    fold_seconds: list[float] = []
    steps: list[int] = []
    batch_seconds: list[list[float]] = []
    accuracy: list[float] = []

    loop_started = time.perf_counter()
    for train, test in splits:
        timer = batch_timer()
        started = time.perf_counter()
        x_train, y_train = x[train], y[train]
        model = keras.applications.ResNet50(
            weights=None, input_shape=(side, side, 3), classes=CLASSES
        )
        model.compile(
            optimizer=keras.optimizers.Adam(LEARNING_RATE),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        if managed:
            model = lc.manage(model)
        fit_started = time.perf_counter()
        model.fit(
            x_train,
            y_train,
            batch_size=args.batch,
            epochs=args.epochs,
            verbose=0,
            callbacks=[timer],
        )
        fit_seconds.append(time.perf_counter() - fit_started)
        scores = model.evaluate(x[test], y[test], batch_size=args.batch, verbose=0)
        if managed:
            model.dispose()
        del model
        fold_seconds.append(time.perf_counter() - started)
        steps.append(steps_per_fold(len(train), args.batch, args.epochs))
        batch_seconds.append(timer.seconds)
        accuracy.append(float(scores[-1]))
    total_seconds = time.perf_counter() - loop_started

    result: dict[str, Any] = {
        "variant": variant,
        "splitter": splitter,
        "step_ms": 1000 * sum(fit_seconds) / sum(steps),
        "steady_step_ms": steady_step_ms(batch_seconds),
        "fold_s": statistics.median(fold_seconds),
        "total_s": total_seconds,
        "fit_s_per_fold": fit_seconds,
        "fold_s_per_fold": fold_seconds,
        "steps_per_fold": steps,
        "batches_per_fold": [len(fold) for fold in batch_seconds],
        "first_batch_ms_per_fold": [1000 * fold[0] if fold else None for fold in batch_seconds],
        "accuracy_per_fold": accuracy,
    }
    if managed:
        stats = lc.statistics(count_graphs=False)
        result.update(
            collections=stats.collections,
            max_collection_seconds=stats.max_collection_seconds,
            blocking_seconds=stats.blocking_seconds,
            models_disposed=stats.models_disposed,
        )
    return result


# -------------------------------------------------------------------------- parent


def child_options(args: argparse.Namespace) -> list[str]:
    return [
        *("--folds", str(args.folds), "--epochs", str(args.epochs)),
        *("--batch", str(args.batch), "--samples", str(args.samples)),
        *("--input-size", str(args.input_size)),
    ]


def describe_run(args: argparse.Namespace, rounds: _harness.Rounds) -> list[str]:
    side = args.input_size
    sizes = fold_sizes(args.samples, args.folds)
    trains = sorted({train for train, _ in sizes})
    steps = sorted({steps_per_fold(train, args.batch, args.epochs) for train in trains})
    found = (r.get("splitter") for v in rounds.variants for r in rounds.results(v) if r)
    splitters = sorted({splitter for splitter in found if splitter})
    return [
        *_harness.machine_lines(),
        f"model:    ResNet50 (weights=None) at {side}x{side}x3, {CLASSES} classes; Adam "
        f"{LEARNING_RATE:g}, sparse categorical crossentropy, accuracy; fit verbose=0",
        f"data:     {args.samples} random images and labels (seed {SEED}), {args.folds} folds "
        f"({' / '.join(splitters) or 'not split'}): {spans(trains)} training samples per "
        f"fold, {spans(steps)} steps of batch {args.batch} ({args.epochs} epoch"
        f"{'s' if args.epochs != 1 else ''})",
        _harness.rounds_line(args.rounds),
    ]


def spans(values: Sequence[int]) -> str:
    """``64`` for one value, ``63-64`` for several (sorted)."""
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def table_rows(rounds: _harness.Rounds) -> list[list[str]]:
    rows = []
    for variant in rounds.variants:
        if not rounds.succeeded(variant):
            rows.append([variant, "FAILED", *["-"] * 5])
            continue
        rows.append(
            [
                variant,
                rounds.cell(variant, "step_ms", ".1f"),
                rounds.cell(variant, "steady_step_ms", ".1f"),
                rounds.cell(variant, "fold_s", ".1f"),
                rounds.cell(variant, "total_s", ".1f"),
                rounds.ratio_cell("step_ms", variant, REFERENCE, ".3f"),
                rounds.ratio_cell("steady_step_ms", variant, REFERENCE, ".3f"),
            ]
        )
    return rows


def target_line(rounds: _harness.Rounds) -> str:
    """Whether the median library/plain ratios are within the target."""
    parts = []
    for metric, name in (("step_ms", "step"), ("steady_step_ms", "steady step")):
        found = _harness.spread_of(rounds.ratios(metric, "library", REFERENCE))
        if found is None:
            parts.append(f"{name} not compared")
        else:
            met = "met" if found.median <= TARGET else "missed"
            parts.append(f"{name} {found.median:.3f}x, {met}")
    return f"target:   library/plain <= {TARGET:.2f}x (median of the per-round ratios): " + (
        "; ".join(parts)
    )


def notes(rounds: _harness.Rounds) -> list[str]:
    if not rounds.succeeded("library"):
        return []
    return [
        f"  library: models disposed {rounds.cell('library', 'models_disposed', '.0f')}; "
        f"cleaner collections {rounds.cell('library', 'collections', '.0f')}, longest "
        f"{rounds.cell('library', milliseconds('max_collection_seconds'), '.1f', ' ms')}, "
        f"holding the interpreter lock "
        f"{rounds.cell('library', milliseconds('blocking_seconds'), '.1f', ' ms')}"
    ]


def milliseconds(key: str) -> _harness.Metric:
    """A metric: the result's ``key`` (seconds) in milliseconds."""

    def metric(result: Mapping[str, Any]) -> float | None:
        value = result.get(key)
        return None if value is None else 1000 * value

    return metric


def run_parent(args: argparse.Namespace) -> int:
    rounds = _harness.run_rounds(
        __file__, args.variants, args.rounds, child_options(args), args.timeout
    )
    header = [
        "variant",
        "step ms",
        "steady step ms",
        "fold s",
        "total s",
        "step vs plain",
        "steady vs plain",
    ]
    legend = [
        "cells: median over the rounds (min-max); vs plain: the variant's value over plain's",
        "       in the same round, median of the per-round ratios (min-max)",
        "step ms:        total fit() time over total training steps, all folds",
        "steady step ms: median training batch (on_train_batch_begin to _end), each fold's",
        "                first batch (tracing) left out",
        "fold s:         median fold, build to drop (compile, fit, evaluate, dispose, del)",
        "total s:        the whole k-fold loop",
        target_line(rounds),
    ]
    _harness.print_report(
        describe_run(args, rounds), header, table_rows(rounds), legend, notes(rounds)
    )
    return _harness.report_round_failures(rounds)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument("--folds", type=int, default=5, help="folds (at least 2)")
    parser.add_argument("--epochs", type=_harness.positive_int, default=1, help="epochs per fold")
    parser.add_argument("--batch", type=_harness.positive_int, default=16, help="batch size")
    parser.add_argument(
        "--samples", type=_harness.positive_int, default=640, help="random samples in all"
    )
    _harness.add_input_size_argument(parser)
    _harness.add_variants_argument(parser, VARIANTS)
    _harness.add_child_arguments(parser, VARIANTS, timeout=1800.0, rounds=3)
    args = parser.parse_args(argv)
    if args.folds < 2:
        parser.error(f"--folds must be at least 2: {args.folds}")
    if args.samples < args.folds:
        parser.error(f"--samples ({args.samples}) must be at least --folds ({args.folds})")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    args.variants = _harness.parse_variants(parser, args.variants, VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
