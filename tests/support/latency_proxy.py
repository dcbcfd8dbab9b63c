"""A TCP proxy on 127.0.0.1 that delays every chunk a client sends, as a network round trip
would: with HTTP keep-alive each request (GET, HEAD, ...) waits the delay once. tc netem is
not in every kernel; this needs nothing but Python.

    python tests/support/latency_proxy.py TARGET_PORT --delay-ms 10     # prints the proxy's port
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from typing import Tuple


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            if delay:
                await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def serve(port: int, target: int, delay: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(_pipe(reader, up_writer, delay), _pipe(up_reader, writer, 0.0))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print(f"proxy 127.0.0.1:{port} -> 127.0.0.1:{target}, {delay * 1000:g} ms per request", flush=True)
    async with server:
        await server.serve_forever()


def start(target: int, delay_ms: float) -> Tuple[subprocess.Popen, int]:
    """(proxy process, its port) in front of 127.0.0.1:``target``; end it with proc.terminate()."""
    from .s3server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, str(target), "--delay-ms", str(delay_ms), "--port", str(port)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # printed once listening
    if not line.startswith("proxy"):
        proc.kill()
        raise RuntimeError("the latency proxy did not start")
    time.sleep(0.05)
    return proc, port


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target", type=int)
    p.add_argument("--delay-ms", type=float, default=10.0)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    asyncio.run(serve(args.port, args.target, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
