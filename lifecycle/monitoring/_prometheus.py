"""Prometheus metrics (extra ``prometheus``): a collector and a local exporter."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ._statistics import statistics

if TYPE_CHECKING:
    from .._registry import ModelRegistry

__all__ = ["Exporter", "LifecycleCollector", "register_prometheus", "start_exporter"]

_INSTALL = 'pip install "keras-lifecycle[prometheus]"'


def _prometheus() -> Any:
    try:
        import prometheus_client
        from prometheus_client import core
    except ImportError as error:
        raise ImportError(
            f"Prometheus metrics need prometheus-client, an optional extra: {_INSTALL}"
        ) from error
    return prometheus_client, core


class LifecycleCollector:
    """A ``prometheus_client`` collector of keras-lifecycle's statistics.

    Each scrape takes one :func:`lc.statistics` snapshot (without counting
    traced graphs, which walks the heap) and the status of the given
    registries. Metric names follow Prometheus conventions: base units
    (``_bytes``, ``_seconds``), counters end in ``_total``.

    Args:
        model_registries: Registries whose versions to report, labelled by
            ``registry``, ``model`` and ``version``. They are held weakly: a
            registry the program drops is no longer reported.
    """

    def __init__(self, model_registries: Iterable[ModelRegistry] = ()) -> None:
        _prometheus()
        self._lock = threading.Lock()
        # Weakly held: reporting a registry must not keep it (and its models) alive.
        self._registries: weakref.WeakSet[ModelRegistry] = weakref.WeakSet(model_registries)

    def add_registry(self, registry: ModelRegistry) -> None:
        """Also report ``registry``'s versions."""
        with self._lock:
            self._registries.add(registry)

    def describe(self) -> list[Any]:
        """No description: the metrics are produced at scrape time."""
        return []

    def collect(self) -> Iterator[Any]:
        """The metric families of one scrape."""
        _, core = _prometheus()
        stats = statistics(count_graphs=False)

        def gauge(name: str, doc: str, value: float) -> Any:
            family = core.GaugeMetricFamily(name, doc)
            family.add_metric([], value)
            return family

        def counter(name: str, doc: str, value: float) -> Any:
            family = core.CounterMetricFamily(name, doc)
            family.add_metric([], value)
            return family

        yield gauge("lifecycle_live_models", "Managed models not disposed.", stats.live_models)
        yield counter(
            "lifecycle_models_managed", "Models put under management.", stats.models_managed
        )
        yield counter(
            "lifecycle_models_disposed", "Models released by dispose().", stats.models_disposed
        )
        yield counter(
            "lifecycle_models_cleaned",
            "Models dropped without dispose() and cleaned up by a session.",
            stats.models_cleaned,
        )
        yield gauge(
            "lifecycle_owned_bytes", "Buffer bytes held by live managed models.", stats.bytes_owned
        )
        yield counter(
            "lifecycle_released_bytes", "Buffer bytes released so far.", stats.bytes_released
        )
        yield gauge(
            "lifecycle_gradient_registry_entries",
            "CustomGradient entries in TensorFlow's gradient registry.",
            stats.gradient_registry_entries,
        )
        yield counter("lifecycle_collections", "Collections run by cleaners.", stats.collections)
        yield counter(
            "lifecycle_collection_seconds",
            "Time spent in collections run by cleaners.",
            stats.collection_seconds,
        )
        yield gauge(
            "lifecycle_collection_seconds_max",
            "The longest collection run by a cleaner.",
            stats.max_collection_seconds,
        )
        yield counter(
            "lifecycle_blocking_seconds",
            "Time the library's work held the interpreter lock off the caller's thread.",
            stats.blocking_seconds,
        )
        yield counter(
            "lifecycle_trims",
            "Times cleaners returned free C-heap memory to the system.",
            stats.trims,
        )
        yield counter("lifecycle_trim_seconds", "Time spent in those trims.", stats.trim_seconds)
        yield counter(
            "lifecycle_kernel_cache_clears",
            "Times TensorFlow's eager kernel cache was cleared.",
            stats.kernel_cache_clears,
        )
        yield gauge("lifecycle_cleaner_queue", "Cleanup tasks waiting.", stats.cleaner_queue)
        if stats.rss_bytes is not None:
            yield gauge(
                "lifecycle_process_resident_memory_bytes",
                "Resident set size of the process.",
                stats.rss_bytes,
            )
        if stats.cpu_pooled_bytes is not None:
            family = core.GaugeMetricFamily(
                "lifecycle_cpu_pooled_bytes",
                "Bytes freed into oneDNN's CPU pool and kept there, not returned to the system.",
                labels=["allocator"],
            )
            family.add_metric([stats.cpu_allocator], stats.cpu_pooled_bytes)
            yield family
        if stats.device_memory:
            family = core.GaugeMetricFamily(
                "lifecycle_device_memory_bytes",
                "Bytes allocated on an accelerator, as TensorFlow reports.",
                labels=["device"],
            )
            for device in stats.device_memory:
                family.add_metric([device.device], device.current_bytes)
            yield family
        yield from self._registry_metrics(core)

    def _registry_metrics(self, core: Any) -> Iterator[Any]:
        with self._lock:
            registries = sorted(self._registries, key=lambda registry: registry.name)
        if not registries:
            return
        labels = ["registry", "model", "version"]
        nbytes = core.GaugeMetricFamily(
            "lifecycle_version_bytes", "Bytes held by a loaded version.", labels=labels
        )
        leases = core.GaugeMetricFamily(
            "lifecycle_version_leases", "Leases in flight on a version.", labels=labels
        )
        requests = core.CounterMetricFamily(
            "lifecycle_version_requests", "Requests served by a version.", labels=labels
        )
        batches = core.CounterMetricFamily(
            "lifecycle_version_batches",
            "Calls of a batching version's model that served requests.",
            labels=labels,
        )
        queued = core.CounterMetricFamily(
            "lifecycle_version_batch_queue_seconds",
            "Time requests waited for their batch to start, in total.",
            labels=labels,
        )
        rejected = core.CounterMetricFamily(
            "lifecycle_version_batch_rejected",
            "Requests refused because max_enqueued_batches batches were waiting.",
            labels=labels,
        )
        sizes = core.HistogramMetricFamily(
            "lifecycle_version_batch_requests",
            "Requests per batch of a batching version.",
            labels=labels,
        )
        for registry in registries:
            try:
                versions = registry.status()
            except Exception:  # a closed registry has nothing to report
                continue
            for status in versions:
                key = [registry.name, status.name, str(status.version)]
                nbytes.add_metric(key, status.bytes)
                leases.add_metric(key, status.leases)
                requests.add_metric(key, status.requests)
                if status.batching is not None:
                    stats = status.batching
                    batches.add_metric(key, stats.batches)
                    queued.add_metric(key, stats.queue_seconds)
                    rejected.add_metric(key, stats.rejected)
                    sizes.add_metric(key, _buckets(stats.sizes), sum_value=stats.requests)
        yield from (nbytes, leases, requests, batches, queued, rejected, sizes)


# Upper bounds of the batch-size histogram's buckets.
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def _buckets(sizes: Mapping[int, int]) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` buckets of ``{requests per batch: batches}``."""
    buckets = [
        (str(le), sum(n for size, n in sizes.items() if size <= le)) for le in _BATCH_BUCKETS
    ]
    return [*buckets, ("+Inf", sum(sizes.values()))]


_registered_lock = threading.Lock()
# Keyed by the Prometheus registry itself, weakly: an entry goes with its
# registry, so a new registry that Python places at a dead one's address is not
# mistaken for it (keying by id() did that, and kept every collector alive).
_registered: weakref.WeakKeyDictionary[Any, LifecycleCollector] = weakref.WeakKeyDictionary()


def register_prometheus(
    registry: Any = None, *, model_registries: Iterable[ModelRegistry] = ()
) -> LifecycleCollector:
    """Register keras-lifecycle's metrics with a Prometheus registry (idempotent).

    Args:
        registry: A ``prometheus_client.CollectorRegistry``; the default
            ``prometheus_client.REGISTRY`` if omitted.
        model_registries: Model registries whose versions to report as well;
            more can be added with ``collector.add_registry()``.

    Returns:
        The :class:`LifecycleCollector` (the same one on later calls for the
        same Prometheus registry; ``model_registries`` are added to it).

    Raises:
        ImportError: prometheus-client is not installed; the message says how
            to install it.

    Example:
        >>> from lifecycle.monitoring import register_prometheus
        >>> collector = register_prometheus()  # doctest: +SKIP
    """
    prometheus_client, _ = _prometheus()
    target = prometheus_client.REGISTRY if registry is None else registry
    with _registered_lock:
        collector = _registered.get(target)
        if collector is None:
            collector = LifecycleCollector()
            target.register(collector)
            _registered[target] = collector
    for model_registry in model_registries:
        collector.add_registry(model_registry)
    return collector


class Exporter:
    """A running ``/metrics`` HTTP endpoint; stop it with :meth:`stop` (or ``with``)."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.address, self.port = server.server_address[:2]

    @property
    def url(self) -> str:
        """The metrics URL."""
        return f"http://{self.address}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_exporter(port: int = 0, addr: str = "127.0.0.1", registry: Any = None) -> Exporter:
    """Serve the metrics of ``registry`` over HTTP, on 127.0.0.1 by default.

    Registers keras-lifecycle's collector first (:func:`register_prometheus`).

    Args:
        port: TCP port; 0 picks a free one (read it from ``exporter.port``).
        addr: Address to bind. Binding anything but a loopback address exposes
            the metrics to the network: choose it deliberately.
        registry: The ``prometheus_client.CollectorRegistry`` to serve; the
            default registry if omitted.

    Returns:
        The running :class:`Exporter`.

    Raises:
        ImportError: prometheus-client is not installed.
        OSError: The address or port cannot be bound.
    """
    prometheus_client, _ = _prometheus()
    target = prometheus_client.REGISTRY if registry is None else registry
    register_prometheus(target)
    server, thread = prometheus_client.start_http_server(port, addr=addr, registry=target)
    return Exporter(server, thread)
