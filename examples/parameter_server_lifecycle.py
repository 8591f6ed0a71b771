"""Model generations on a parameter-server cluster: the PS keeps every one unless disposed.

Once a scheduled step has applied gradients, dropping every Python reference to
a model frees nothing on the parameter server: its variables stay there for the
life of the PS process. This example trains several generations of a model on a
local cluster (one parameter server and one worker, each its own process, this
process as the chief), twice:

- with ``model.dispose()`` after each generation: the PS's memory stays flat;
- with plain Keras and the usual advice, ``del model; keras.backend.clear_session();
  gc.collect()``: the PS grows by the model's bytes every generation.

The cluster runs in a private network namespace (Linux): TensorFlow's servers
listen on every interface, and the namespace keeps them local. The cluster and
the namespace come from the library's own test harness
(``lifecycle.distribute._cluster``), which is not part of its API. Run it::

    python examples/parameter_server_lifecycle.py --generations 4
"""

from __future__ import annotations

import argparse
import gc
import sys

MiB = 2**20


def generations(*, count: int, units: int, dispose: bool) -> list[tuple[int, float, float]]:
    """Train ``count`` generations; returns (generation, PS MiB after training, after cleanup)."""
    import keras
    import tensorflow as tf

    import lifecycle as lc
    from lifecycle.distribute._cluster import LocalCluster

    rows = []
    with LocalCluster(workers=1, ps=1, lifetime=300) as cluster:
        strategy = tf.distribute.ParameterServerStrategy(cluster.resolver)
        baseline = cluster.rss_bytes("ps")

        def data() -> tf.data.Dataset:
            x = tf.random.stateless_normal([32, 256], seed=[1, 2])
            return tf.data.Dataset.from_tensors((x, tf.reduce_sum(x, 1, keepdims=True))).repeat()

        for generation in range(1, count + 1):
            with strategy.scope():
                inputs = keras.Input((256,))
                hidden = keras.layers.Dense(units, activation="relu")(inputs)
                outputs = keras.layers.Dense(1)(hidden)
                # The managed model, or the plain Keras one.
                model = (lc.ManagedModel if dispose else keras.Model)(inputs, outputs)
                model.compile(keras.optimizers.Adam(1e-3), "mse")
            loss = lc.distribute.train(model, data, steps=5)
            trained = (cluster.rss_bytes("ps") - baseline) / MiB
            if dispose:
                model.dispose()
                del model
            else:
                del model
                keras.backend.clear_session()
            gc.collect()
            after = (cluster.rss_bytes("ps") - baseline) / MiB
            rows.append((generation, trained, after))
            print(
                f"  generation {generation}: loss {loss:7.2f}   PS {trained:+6.1f} MiB while "
                f"training, {after:+6.1f} MiB after "
                f"{'dispose()' if dispose else 'del model + clear_session() + gc.collect()'}",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run both variants and compare the parameter server's memory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--units", type=int, default=4096, help="hidden units (model size)")
    args = parser.parse_args(argv)

    from lifecycle.distribute._cluster import run_in_private_network
    from lifecycle.distribute._network import in_private_network

    if not in_private_network():
        # Re-run this script inside a private network namespace.
        result = run_in_private_network([sys.executable, __file__, *sys.argv[1:]], timeout=600)
        raise SystemExit(result.returncode)

    model_mib = (256 * args.units + args.units + args.units + 1) * 4 * 3 / MiB  # + 2 Adam slots
    print(f"model: {model_mib:.1f} MiB of weights and Adam slots on the parameter server")
    print("with dispose():")
    kept = generations(count=args.generations, units=args.units, dispose=True)
    print("plain Keras, del model + clear_session() + gc.collect():")
    leaked = generations(count=args.generations, units=args.units, dispose=False)
    growth_kept = (kept[-1][2] - kept[0][2]) / max(1, len(kept) - 1)
    growth_leaked = (leaked[-1][2] - leaked[0][2]) / max(1, len(leaked) - 1)
    print(
        f"PS growth per generation: {growth_kept:+.1f} MiB with dispose(), "
        f"{growth_leaked:+.1f} MiB with plain Keras (the model is {model_mib:.1f} MiB)"
    )
    print(
        f"PS after the last generation: {kept[-1][2]:+.1f} MiB with dispose(), "
        f"{leaked[-1][2]:+.1f} MiB with plain Keras"
    )


if __name__ == "__main__":
    main()
