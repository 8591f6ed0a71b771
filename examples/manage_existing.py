"""Put models you already have under management, without changing their class.

``lc.manage`` works on any ``keras.Model``: Sequential, functional, subclassed or
a ``keras.applications`` architecture. The object stays an instance of its own
class and saves as before.

Run: python examples/manage_existing.py
"""

from __future__ import annotations

import keras
import numpy as np

import lifecycle as lc


def main() -> None:
    models = {
        "sequential": keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)]),
        "application": keras.applications.MobileNetV2(
            weights=None, input_shape=(32, 32, 3), classes=10, alpha=0.35
        ),
    }
    for kind, model in models.items():
        lc.manage(model)
        x = np.zeros((1, *model.input_shape[1:]), "float32")
        model(x)
        print(f"{kind}: {type(model).__name__}, owns {model.owned_bytes / 1024:.1f} KiB")
        report = model.dispose()
        print(f"  disposed: released {report.variables_released} buffers, state {model.state}")
        try:
            model(x)
        except lc.DisposedError as error:
            print(f"  calling it now raises DisposedError: {str(error)[:60]}...")


if __name__ == "__main__":
    main()
