"""The Gluon calls whose names changed between the Triton releases the build
supports (3.6 and 3.9), under one name each, so that the kernels read the
same for both: Triton 3.8 renamed the TMA copies (async_copy_global_to_shared
-> tma.async_load, async_copy_shared_to_global -> tma.async_store) and the
pointer copy (async_copy.async_copy_global_to_shared -> async_copy.async_load),
and 3.9 removed the old names; shared_memory_descriptor._reinterpret became
public (reinterpret), gl.thread_barrier became gl.barrier and gl.clamp
appeared (3.6's Gluon has Triton's clamp under no name).  The choice is made
once, when this module is imported by the compiler's Python; every kernel
module that uses one of these imports this one."""
from triton import language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language import _core as gluon_core
from triton.experimental.gluon.language.nvidia.hopper import async_copy, mbarrier, tma

_RENAMED = hasattr(tma, "async_load")
HAS_BARRIER = gl.constexpr(hasattr(gl, "barrier"))

# tma_load(desc, coord, barrier, buffer): the TMA copy of desc's block at
# coord into buffer, completing on barrier.  tma_store(desc, coord, buffer):
# buffer to desc's block at coord.
tma_load = tma.async_load if _RENAMED else tma.async_copy_global_to_shared
tma_store = tma.async_store if _RENAMED else tma.async_copy_shared_to_global
# cp_async_load(buffer, pointers, mask): each thread's elements of pointers
# copied into buffer by cp.async (zeros where mask is false).
cp_async_load = (async_copy.async_load if hasattr(async_copy, "async_load")
                 else async_copy.async_copy_global_to_shared)

# clamp(x, low, high): tl.clamp's semantics, in Gluon.
clamp = gl.clamp if hasattr(gl, "clamp") else gluon_core.builtin(tl.clamp)

# buf.reinterpret(dtype, shape, layout): the same bytes seen another way.  A
# method, so no jit function can stand in for it (3.6 takes no list of ints as
# a jit function's argument): 3.6's private name is given the public one.
if not hasattr(gl.shared_memory_descriptor, "reinterpret"):
    gl.shared_memory_descriptor.reinterpret = gl.shared_memory_descriptor._reinterpret


@gluon.jit
def thread_barrier():
    """Every thread of the program waits for the others (bar.sync)."""
    if HAS_BARRIER:
        gl.barrier()
    else:
        gl.thread_barrier()


# What 2-CTA clusters need, from Triton 3.8 on (a Gluon program is then a
# whole cluster; aot/kernels/ws.py): a TMA copy that lands in every CTA of the
# cluster (the compiler has the loaders of the cluster's CTAs meet before each
# such copy, so it lands only in slots every CTA has freed; the meeting's
# cluster-scope release and acquire are what make these kernels slow, see
# docs/notes/2026-11-25-two-cta-multicast-barrier-scope.md) and barriers one
# per CTA.  Defined only where the release has them, so that Triton 3.6 never
# reads their names.
CLUSTERS = _RENAMED and hasattr(mbarrier, "allocate_mbarrier")
if CLUSTERS:

    @gluon.jit
    def tma_load_multicast(desc, coord, barrier, buffer):
        """tma_load into buffer in every CTA of the cluster (issued by CTA 0)."""
        tma.async_load(desc, coord, barrier, buffer, multicast=True)

    @gluon.jit
    def cluster_barriers(count: gl.constexpr):
        """count barriers in each CTA, each CTA's own ([count, CTAs])."""
        return mbarrier.allocate_mbarrier(batch=count)

else:

    @gluon.jit
    def tma_load_multicast(desc, coord, barrier, buffer):
        gl.static_assert(False, "TMA multicast needs Triton 3.8 or later")

    @gluon.jit
    def cluster_barriers(count: gl.constexpr):
        gl.static_assert(False, "clusters need Triton 3.8 or later")
