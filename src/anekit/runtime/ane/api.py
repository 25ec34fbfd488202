"""The private AppleNeuralEngine API the backend uses, declared once as data (classes, messages, constants).

Every message is checked before first use (``ObjCRuntime.bind``): a missing class or selector raises
ClassNotFound naming it and the macOS version, because the framework changes between releases.
"""

from __future__ import annotations

from collections.abc import Sequence

from anekit.errors import AneRuntimeError
from anekit.runtime.ane.objc import Id, Message, ObjCRuntime, msg

ANE_FRAMEWORK = "/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/AppleNeuralEngine"
QOS = 21  # the quality-of-service class public working code passes to every call (maderix/ANE, Orion)
MODEL_PATH = "@model_path/"

# -- compile / load / run / unload: the four classes every hardware-run project uses -----------------

CLASSES = ("_ANEInMemoryModelDescriptor", "_ANEInMemoryModel", "_ANERequest", "_ANEIOSurfaceObject")

DESCRIPTOR_WITH_MIL = msg("+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]", "@ @ @ @")
MODEL_WITH_DESCRIPTOR = msg("+[_ANEInMemoryModel inMemoryModelWithDescriptor:]", "@ @")
MODEL_HEX_ID = msg("-[_ANEInMemoryModel hexStringIdentifier]", "@")
MODEL_COMPILE = msg("-[_ANEInMemoryModel compileWithQoS:options:error:]", "B I @ ^@")
MODEL_LOAD = msg("-[_ANEInMemoryModel loadWithQoS:options:error:]", "B I @ ^@")
MODEL_EVALUATE = msg("-[_ANEInMemoryModel evaluateWithQoS:options:request:error:]", "B I @ @ ^@")
MODEL_UNLOAD = msg("-[_ANEInMemoryModel unloadWithQoS:error:]", "B I ^@")
SURFACE_OBJECT = msg("+[_ANEIOSurfaceObject objectWithIOSurface:]", "@ ^v")
REQUEST = msg(
    "+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:"
    "procedureIndex:]",
    "@ @ @ @ @ @ @ @",
)
REQUIRED = (
    DESCRIPTOR_WITH_MIL,
    MODEL_WITH_DESCRIPTOR,
    MODEL_HEX_ID,
    MODEL_COMPILE,
    MODEL_LOAD,
    MODEL_EVALUATE,
    MODEL_UNLOAD,
    SURFACE_OBJECT,
    REQUEST,
)

# -- the real-time path (opt-in) -------------------------------------------------------------------------
# The _ANEClient selectors are listed by maderix/ANE training/m5result.md ("Notable _ANEClient Methods").
# Public benchmark code hands evaluateRealTimeWithModel: the in-memory model's ``model`` property (the
# underlying _ANEModel), not the _ANEInMemoryModel itself, with an empty options dictionary; public
# bridge code brackets it with beginRealTimeTask + loadRealTimeModel:options:qos:error: after the normal
# load, and unloadRealTimeModel:options:qos:error: + endRealTimeTask before the normal unload.

CLIENT_SHARED = msg("+[_ANEClient sharedConnection]", "@")
MODEL_ANE_MODEL = msg("-[_ANEInMemoryModel model]", "@")
CLIENT_BEGIN_REALTIME = msg("-[_ANEClient beginRealTimeTask]", "B")
CLIENT_END_REALTIME = msg("-[_ANEClient endRealTimeTask]", "B")
CLIENT_LOAD_REALTIME = msg("-[_ANEClient loadRealTimeModel:options:qos:error:]", "B @ @ I ^@")
CLIENT_UNLOAD_REALTIME = msg("-[_ANEClient unloadRealTimeModel:options:qos:error:]", "B @ @ I ^@")
CLIENT_EVALUATE_REALTIME = msg("-[_ANEClient evaluateRealTimeWithModel:options:request:error:]", "B @ @ @ ^@")
REALTIME = (
    CLIENT_SHARED,
    MODEL_ANE_MODEL,
    CLIENT_BEGIN_REALTIME,
    CLIENT_END_REALTIME,
    CLIENT_LOAD_REALTIME,
    CLIENT_UNLOAD_REALTIME,
    CLIENT_EVALUATE_REALTIME,
)

# -- chaining (opt-in; see anekit.runtime.ane.chaining) ---------------------------------------------------

BUFFER = msg("+[_ANEBuffer bufferWithIOSurfaceObject:symbolIndex:source:]", "@ @ @ q")
OUTPUT_SETS = msg("+[_ANEIOSurfaceOutputSets objectWithstatsSurRef:outputBuffer:]", "@ ^v @")
CHAINING_REQUEST = msg(
    "+[_ANEChainingRequest chainingRequestWithInputs:outputSets:lbInputSymbolId:lbOutputSymbolId:"
    "procedureIndex:signalEvents:transactionHandle:fwEnqueueDelay:memoryPoolId:]",
    "@ @ @ @ @ @ @ @ @ @",
)
CHAINING_VALIDATE = msg("-[_ANEChainingRequest validate]", "B")
CLIENT_PREPARE_CHAINING = msg(
    "-[_ANEClient prepareChainingWithModel:options:chainingReq:qos:error:]", "B @ @ @ I ^@"
)
OUTPUT_SET_ENQUEUE = msg(
    "+[_ANEOutputSetEnqueue outputSetWithProcedureIndex:setIndex:signalValue:signalNotRequired:isOpenLoop:]",
    "@ I I Q B B",
)
INPUT_BUFFERS_READY = msg(
    "+[_ANEInputBuffersReady inputBuffersWithProcedureIndex:inputBufferInfoIndex:inputFreeValue:"
    "executionDelay:]",
    "@ I @ @ Q",
)
CLIENT_ENQUEUE_SETS = msg("-[_ANEClient enqueueSetsWithModel:outputSet:options:qos:error:]", "B @ @ @ I ^@")
CLIENT_BUFFERS_READY = msg(
    "-[_ANEClient buffersReadyWithModel:inputBuffers:options:qos:error:]", "B @ @ @ I ^@"
)
MODEL_UUID = msg("-[_ANEInMemoryModel getUUID]", "@")  # checked, never sent
CHAINING = (
    CLIENT_SHARED,
    BUFFER,
    OUTPUT_SETS,
    CHAINING_REQUEST,
    CHAINING_VALIDATE,
    CLIENT_PREPARE_CHAINING,
    OUTPUT_SET_ENQUEUE,
    INPUT_BUFFERS_READY,
    CLIENT_ENQUEUE_SETS,
    CLIENT_BUFFERS_READY,
)


def first_missing(rt: ObjCRuntime, messages: Sequence[Message]) -> str | None:
    """The first of ``messages`` that cannot be sent (``class X`` or ``-[X sel]``), or None."""
    for m in messages:
        missing = rt.missing(m)
        if missing is not None:
            return missing
    return None


def nil_check(obj: Id | None, fails: type[AneRuntimeError], what: str) -> Id:
    """``obj``, or ``fails`` saying that ``what`` returned nil."""
    if not obj:
        raise fails(f"{what} returned nil")
    return obj
