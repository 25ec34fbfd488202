"""The ``_ANERequest``: a kernel's surfaces wrapped for one evaluation, built after every load.

``+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:
procedureIndex:]`` takes arrays of ``+[_ANEIOSurfaceObject objectWithIOSurface:]`` and of NSNumber
indices 0..n-1, then nil, nil, @0 (maderix/ANE training/ane_runtime.h, mechramc/Orion
core/ane_runtime.m). The surfaces come in binding order: alphabetical by MIL name
(``anekit.runtime.ane.binding``).

maderix/ANE training/ane_runtime.h builds the request after the model is loaded, and Orion builds a
fresh one for every evaluation; nothing public reuses a request across an unload and a reload. So a
request is built by each ``load`` and released by the matching ``unload`` (rule
process.request-per-load); evaluations between the two reuse it.
"""

from __future__ import annotations

from collections.abc import Sequence

from anekit.errors import SurfaceCreationFailed
from anekit.runtime.ane.api import REQUEST, SURFACE_OBJECT, nil_check
from anekit.runtime.ane.objc import Id, ObjCRuntime
from anekit.runtime.ane.surfaces import AneSurface


def build_request(
    rt: ObjCRuntime, inputs: Sequence[AneSurface], outputs: Sequence[AneSurface], what: str
) -> Id:
    """A retained _ANERequest binding ``inputs`` / ``outputs`` (in binding order) to indices 0..n-1.

    The caller owns the reference and releases it (``rt.release``) when the model is unloaded.
    """
    with rt.autorelease_pool():

        def wrap(s: AneSurface) -> Id:
            return nil_check(
                rt.send(SURFACE_OBJECT, s.ref), SurfaceCreationFailed, f"{what}: {SURFACE_OBJECT}"
            )

        ins, outs = [wrap(s) for s in inputs], [wrap(s) for s in outputs]
        request = rt.send(
            REQUEST,
            rt.array(ins),
            rt.array(list(range(len(ins)))),
            rt.array(outs),
            rt.array(list(range(len(outs)))),
            None,
            None,
            rt.number(0),
        )
        return rt.retain(nil_check(request, SurfaceCreationFailed, f"{what}: {REQUEST}"))
