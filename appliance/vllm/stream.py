"""One request's deltas from the managed vLLM server, as the engine client protocol hands them out: the stream
leaves the client's registry when it ends, fails or is closed."""

from __future__ import annotations

from engine import RequestOutput
from web.backends.upstream_stream import UpstreamStream


class VllmStream:
    """One request's deltas from the server; closing it before the final delta closes the connection, which
    is how vLLM is told to abort."""

    __slots__ = ("_error", "_inner", "_streams", "request_id")

    def __init__(
        self,
        streams: dict[str, UpstreamStream],
        request_id: str,
        inner: UpstreamStream | None,
        error: Exception | None,
    ) -> None:
        self._streams = streams  # the client's streams in flight by request id, which abort() finds them in
        self.request_id = request_id
        self._inner = inner
        self._error = error

    def __aiter__(self) -> VllmStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._inner is None:
            error, self._error = self._error, None
            if error is None:
                raise StopAsyncIteration
            raise error
        try:
            out = await self._inner.__anext__()
        except Exception:  # a refusal, a failure or the end; a cancelled consumer leaves it for aclose()
            self._release()
            raise
        if out.finished:
            self._release()
        return out

    async def aclose(self) -> None:
        inner = self._release()
        if inner is not None:
            await inner.aclose()

    def _release(self) -> UpstreamStream | None:
        inner, self._inner = self._inner, None
        if inner is not None and self._streams.get(self.request_id) is inner:
            del self._streams[self.request_id]
        return inner
