"""A serving lease: one version held for one request, from decoding to answer.

A request that reads the signature of one resolution of a route and runs on
another decodes against the wrong version whenever the route's choice differs
between the two (an A/B split between versions whose inputs differ). A
:class:`ServingLease` resolves once: the signature it shows is the signature of
the version its :meth:`~ServingLease.infer` runs, and that version is not
disposed while the lease is held.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .._tf import SERVING_SIGNATURE
from ..errors import ClosedError
from ._signature import Inference, ServingSignature
from ._versions import LoadedVersion

__all__ = ["ServingLease"]


@attrs.define(eq=False)
class ServingLease:
    """A version of a model held for one request (see :meth:`ModelRegistry.serving`).

    Valid only inside its ``with`` block: afterwards the version may be
    disposed, and :meth:`infer` raises :class:`~lifecycle.errors.ClosedError`.

    Attributes:
        name: The model.
        version: The version the request resolved to, and runs on.
        signature: That version's serving signature: decode the request against it.
    """

    name: str
    version: int
    signature: ServingSignature
    _loaded: LoadedVersion = attrs.field(alias="loaded", repr=False)
    # False once the lease has been returned.
    _held: bool = attrs.field(default=True, init=False, repr=False)

    @property
    def signatures(self) -> dict[str, ServingSignature]:
        """Every signature of the held version by name, ``serving_default`` first.

        A model built by a factory or read from a ``.keras`` file has one; a
        SavedModel has each of its signatures.
        """
        return self._loaded.signatures

    def signature_named(self, name: str | None) -> ServingSignature:
        """The held version's signature called ``name`` (``None`` or ``""``: the default).

        Raises:
            ValueError: The version has no such signature.
        """
        if not name or name == SERVING_SIGNATURE:
            return self.signature
        other = self._loaded.others.get(name)
        if other is None:
            raise ValueError(
                f"Serving signature name: {name!r} not found in signature def of "
                f"{self.name!r} version {self.version}. Signatures: {list(self.signatures)}"
            )
        return other[0]

    def infer(self, inputs: Mapping[str, Any], signature_name: str | None = None) -> Inference:
        """Run one of the held version's signatures on named inputs.

        Args:
            inputs: ``{input name: array-like}``; every input of the signature.
            signature_name: Which signature (:attr:`signatures`); ``None``: the
                default one, ``serving_default``, through the version's traced
                (and, if configured, batched) serving function.

        Returns:
            The named outputs as NumPy arrays, and the version that computed them.

        Raises:
            ClosedError: The lease was returned (used after its ``with`` block).
            ValueError: No such signature; an input is missing, unknown, or of
                the wrong shape.
            TypeError: ``inputs`` is not a mapping, or a value does not convert
                to its input's dtype.
        """
        if not self._held:
            raise ClosedError(
                f"This lease of {self.name!r} version {self.version} was returned when its "
                "`with registry.serving(...)` block ended; take a new one to run a request."
            )
        if not isinstance(inputs, Mapping):
            raise TypeError(
                f"`inputs` must be a mapping of input names to values. Received: {inputs!r}"
            )
        signature = self.signature_named(signature_name)
        if signature is self.signature:
            serve = self._loaded.serve
            assert serve is not None  # held: not disposed
        else:
            serve = self._loaded.others[signature_name][1]  # type: ignore[index]
        outputs = signature.name_outputs(serve(signature.feed(inputs)))
        return Inference(
            name=self.name,
            version=self.version,
            outputs={key: value.numpy() for key, value in outputs.items()},
        )

    def _return(self) -> None:
        self._held = False
