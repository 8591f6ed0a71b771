"""k-fold scores and a grid search over a Keras model, each fitted model disposed.

``ManagedSKLearnClassifier`` is ``keras.wrappers.SKLearnClassifier`` whose fitted
model is disposed when scikit-learn is done with it: each fold's clone once it
is scored. ``GridSearchCV`` keeps only its refit ``best_estimator_``.

Run: python examples/sweep_sklearn.py
"""

from __future__ import annotations

import keras
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, cross_val_score

import lifecycle as lc
from lifecycle.integrations.sklearn import ManagedSKLearnClassifier

BUILT: list[keras.Model] = []  # only to show what became of each model


def build(X, y, units: int = 32) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((X.shape[1],)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(y.shape[1], activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    BUILT.append(model)
    return model


def states() -> str:
    disposed = sum(m.state is lc.ModelState.DISPOSED for m in BUILT)
    return f"{disposed} of {len(BUILT)} fitted models disposed"


def main() -> None:
    keras.config.disable_interactive_logging()
    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype("float32")
    keras.utils.set_random_seed(0)
    classifier = ManagedSKLearnClassifier(build, fit_kwargs={"epochs": 3, "verbose": 0})

    scores = cross_val_score(classifier, x, y, cv=5)
    print(f"5-fold accuracy: {scores.mean():.3f} ± {scores.std():.3f}; {states()}")

    search = GridSearchCV(classifier, {"model_kwargs": [{"units": 16}, {"units": 64}]}, cv=3)
    search.fit(x, y)
    print(f"grid search: best {search.best_params_}, accuracy {search.best_score_:.3f}; {states()}")
    print(f"refit best model: {search.best_estimator_.model_.state.value}")
    del search  # the search lets go of its refit model
    print(f"after the search: {states()}")


if __name__ == "__main__":
    main()
