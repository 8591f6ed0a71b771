"""``lifecycle version``: the installed versions and the compatibility self-check."""

from ._app import console


def version() -> None:
    """Print the versions and run the compatibility self-check."""
    import lifecycle as lc

    out = console()
    report = lc.check_compatibility()
    out.print(
        f"keras-lifecycle {lc.__version__}, TensorFlow {report.tensorflow}, Keras {report.keras}"
    )
    for check in report.checks:
        out.print(f"  ok  {check}", markup=False)
