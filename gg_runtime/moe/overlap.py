"""Expert parallelism's overlap: a layer's tokens in chunks, each chunk's
transfers on a second stream while the experts of its neighbours run on
the caller's.  In the order the work is issued:

    transport stream:  D0  D1  R0  D2  R1 ...  R(n-1)
    caller's stream:       E0  E1      E2 ...

chunk i's dispatch (Di) runs while chunk i - 1's experts (Ei-1) do, and its
return (Ri) while chunk i + 1's experts do.  Both are persistent kernels
sized to the SMs they may fill: the transport's are held to `transport_sms`
SMs and the experts' to the rest (gg_runtime.sm_limit), so that neither
waits for the other's SMs.  Only the first dispatch and the last return are
not hidden.  The streams fork from the caller's and join it again, so a
CUDA graph captures the whole; each tensor made on one stream and read on
the other is recorded on that one for the caching allocator."""
from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from ..settings import sm_limit

# The transport's second stream, one a device, made on first use.
_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def pipelined(tokens: int, lanes: list, dispatch: Callable, experts: Callable,
              returned: Callable, transport_sms: int, device: torch.device) -> torch.Tensor:
    """The layer's output over `tokens` tokens in len(lanes) chunks of
    lanes[0].capacity (the last ones may be short, or empty: every rank runs
    every chunk's transfers): `dispatch(lane, part) -> (plan, operands)` and
    `returned(plan, out) -> [part's tokens, H]` on the transport stream,
    `experts(plan, operands) -> out` on the caller's."""
    step = lanes[0].capacity
    parts = [slice(min(i * step, tokens), min((i + 1) * step, tokens)) for i in range(len(lanes))]
    streams = _Streams(device, transport_sms)
    plans, outs, done, results = [], [], [], []

    def return_chunk(i):
        with streams.transport(waits_for=done[i]):
            results.append(streams.handed_over(returned(plans[i], outs[i]), to_compute=True))

    for i, (lane, part) in enumerate(zip(lanes, parts)):
        with streams.transport():
            plan, operands = dispatch(lane, part)
            operands = streams.handed_over((operands, plan.local_ids), to_compute=True)[0]
        with streams.compute():
            out = experts(plan, operands)
            outs.append(streams.handed_over(out, to_compute=False))
            plans.append(plan)
            done.append(streams.event())
        if i:
            return_chunk(i - 1)
    return_chunk(len(lanes) - 1)
    streams.join()
    return torch.cat(results)


class _Streams:
    """The caller's stream and the transport's, with each one's SM limit; on
    a CPU device (the tests' simulated ranks) one stream and no limits."""

    def __init__(self, device: torch.device, transport_sms: int):
        self.cuda = device.type == "cuda"
        if not self.cuda:
            return
        self.main = torch.cuda.current_stream(device)
        if device not in _STREAMS:
            _STREAMS[device] = torch.cuda.Stream(device)
        self.side = _STREAMS[device]
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.transport_sms, self.experts_sms = transport_sms, max(1, sms - transport_sms)
        self.side.wait_stream(self.main)  # the fork: the inputs are ready

    @contextlib.contextmanager
    def transport(self, waits_for=None):
        """The transport stream (after `waits_for`, an event of the caller's),
        its kernels held to transport_sms SMs."""
        if not self.cuda:
            yield
            return
        if waits_for is not None:
            self.side.wait_event(waits_for)
        with torch.cuda.stream(self.side), sm_limit(self.transport_sms):
            yield

    @contextlib.contextmanager
    def compute(self):
        """The caller's stream, after what the transport has issued so far,
        its kernels held to the SMs the transport leaves."""
        if not self.cuda:
            yield
            return
        self.main.wait_stream(self.side)
        with sm_limit(self.experts_sms):
            yield

    def event(self):
        """An event after the caller's stream's work so far (None on CPU)."""
        return self.main.record_event() if self.cuda else None

    def handed_over(self, value, to_compute: bool):
        """`value` (tensors, Quantized or tuples of them), each tensor marked
        as read by the other stream (the caller's where to_compute, else the
        transport's) until that stream's work so far is done."""
        if self.cuda:
            stream = self.main if to_compute else self.side
            for tensor in _tensors(value):
                tensor.record_stream(stream)
        return value

    def join(self):
        """The caller's stream waits for the transport's."""
        if self.cuda:
            self.main.wait_stream(self.side)


def _tensors(value):
    """The tensors in value, a tensor or nested tuples (a Quantized is one) and lists."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
