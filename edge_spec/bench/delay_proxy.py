"""A TCP proxy that holds every chunk coming back from the server for a fixed time: a round trip
through it takes that much longer, as through a link with that latency, where the kernel has no
`tc netem` (this machine's has no sch_netem). Order is kept; bandwidth is not limited; asyncio's
timer rounds the wait up to the millisecond.

    with DelayProxy(("127.0.0.1", 50052), delay_s=0.001) as proxy:   # +1 ms per round trip
        ... connect to proxy.endpoint ...
"""

from __future__ import annotations

import asyncio
import threading
import time


class DelayProxy:
    def __init__(self, upstream: tuple[str, int], delay_s: float) -> None:
        self.upstream, self.delay_s = upstream, delay_s
        self.address: tuple[str, int] = ("127.0.0.1", 0)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delay-proxy", daemon=True)

    def __enter__(self) -> DelayProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def endpoint(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.address = server.sockets[0].getsockname()[:2]
        self._ready.set()
        self._loop.run_forever()
        # Finish here, in this thread: connections' tasks left pending would be finalised by
        # whichever thread the garbage collector next runs in.
        server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.run_until_complete(server.wait_closed())
        self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._pump(reader, up_writer, 0.0), self._pump(up_reader, writer, self.delay_s)
        )

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(1 << 16)
                queue.put_nowait((time.monotonic() + delay_s, data))
                if not data:
                    break
        except (ConnectionError, OSError):
            queue.put_nowait((0.0, b""))
        try:
            await sender
        except (ConnectionError, OSError):
            pass
