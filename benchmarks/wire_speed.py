"""Wire speed: the training transport against a raw socket echo of the same bytes.

Two figures, each measured for ``dlrover_kfp.training.wire`` and for a bare TCP echo
(``sendall`` + ``recv_into`` of exactly the same number of bytes, no framing at all):

* round trips per second of a small control message (``{"step": n}``, about 48 bytes);
* the round-trip time of one batch of embedding rows, 512 x 26 x 16 float32 = 852 KB, each way.

Target: ours within 1.5x of raw for the 852 KB round trip. Each echo server runs in its own
process, as in a real job, so client and server do not share a GIL; the two transports are
measured in alternating rounds so that machine noise hits both alike, and the medians are
printed with the ratio ours/raw.

    python benchmarks/wire_speed.py [--seconds 1.0] [--rounds 5] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_kfp.training.wire import (
    Message,
    PeerInfo,
    Server,
    connect,
    encode_frame,
    new_secret,
    secret_from_env,
    secret_to_env,
)

ROWS, FIELDS, DIM = 512, 26, 16
LOCAL = ("127.0.0.1", 0)


# ------------------------------------------------------------------------ server processes


def serve_ours() -> None:
    def handler(peer: PeerInfo, msg: Message) -> Message:
        # What a PS does: answer with rows of the same size (here the request's own arrays).
        return Message("pong", msg.meta, msg.arrays)

    server = Server(LOCAL, secret_from_env(), handler)
    print(server.address[1], flush=True)
    server.serve_forever()


def serve_raw() -> None:
    """Per connection: an 8-byte size, then echo blocks of exactly that size until EOF."""
    listener = socket.create_server(LOCAL)
    print(listener.getsockname()[1], flush=True)
    while True:
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with sock:
            size_b = bytearray(8)
            if not recv_exact(sock, memoryview(size_b)):
                continue
            buf = memoryview(bytearray(int.from_bytes(size_b, "little")))
            while recv_exact(sock, buf):
                sock.sendall(buf)


def recv_exact(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def start(kind: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


# --------------------------------------------------------------------------------- clients


def ours_small(port: int, secret: bytes) -> Callable[[int], float]:
    conn = connect(("127.0.0.1", port), secret)

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for step in range(n):
            conn.request("ping", {"step": step})
        return time.perf_counter() - t0

    return run


def ours_big(port: int, secret: bytes, rows: np.ndarray) -> Callable[[int], float]:
    conn = connect(("127.0.0.1", port), secret)

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            reply = conn.request("lookup", None, (rows,))
        elapsed = time.perf_counter() - t0
        assert reply.arrays[0].shape == rows.shape
        return elapsed

    return run


def raw_echo(port: int, size: int) -> Callable[[int], float]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(30.0)  # the same timeout (hence the same poll-per-call) as ours
    sock.sendall(size.to_bytes(8, "little"))
    out = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes()
    back = memoryview(bytearray(size))

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            sock.sendall(out)
            recv_exact(sock, back)
        return time.perf_counter() - t0

    return run


def calibrate(run: Callable[[int], float], seconds: float) -> int:
    """How many round trips take about ``seconds`` (after a warm-up)."""
    n = 1
    while True:
        elapsed = run(n)
        if elapsed > seconds / 10:
            return max(1, int(n * seconds / elapsed))
        n *= 4


def compare(
    name: str,
    ours: Callable[[int], float],
    raw: Callable[[int], float],
    seconds: float,
    rounds: int,
) -> tuple[float, float]:
    """Median seconds per round trip for each, measured in alternating rounds."""
    n_ours, n_raw = calibrate(ours, seconds), calibrate(raw, seconds)
    per_ours, per_raw = [], []
    for _ in range(rounds):
        per_ours.append(ours(n_ours) / n_ours)
        per_raw.append(raw(n_raw) / n_raw)
    med_ours, med_raw = statistics.median(per_ours), statistics.median(per_raw)
    print(f"\n{name}  ({rounds} alternating rounds of ~{seconds:.1f} s each; medians)")
    print(
        f"  spread (max-min)/median: ours {(max(per_ours) - min(per_ours)) / med_ours:.0%}, "
        f"raw {(max(per_raw) - min(per_raw)) / med_raw:.0%}"
    )
    return med_ours, med_raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=["ours", "raw"], help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=1.0, help="per round and transport")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="profile our big round trip")
    args = parser.parse_args()
    if args.serve == "ours":
        serve_ours()
        return
    if args.serve == "raw":
        serve_raw()
        return

    secret = new_secret()
    env = dict(os.environ, DLROVER_KFP_JOB_SECRET=secret_to_env(secret))
    rows = np.random.default_rng(0).standard_normal((ROWS, FIELDS, DIM)).astype(np.float32)
    small_frame = len(encode_frame("ping", {"step": 1234}))
    big_frame = len(encode_frame("lookup", None, (rows,)))
    print(
        f"wire speed on {platform.platform()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs"
    )
    print(
        f"small message: {small_frame} bytes framed; batch: {rows.nbytes} bytes of rows, "
        f"{big_frame} bytes framed; raw echoes move the framed size"
    )

    procs = []
    try:
        ours_proc, ours_port = start("ours", env)
        procs.append(ours_proc)
        raw_proc, raw_port = start("raw", env)
        procs.append(raw_proc)

        small_ours, small_raw = compare(
            "small messages",
            ours_small(ours_port, secret),
            raw_echo(raw_port, small_frame),
            args.seconds,
            args.rounds,
        )
        print(f"  ours {1 / small_ours:10,.0f} round trips/s   ({small_ours * 1e6:7.1f} us)")
        print(f"  raw  {1 / small_raw:10,.0f} round trips/s   ({small_raw * 1e6:7.1f} us)")
        print(f"  ratio ours/raw (time per round trip): {small_ours / small_raw:.2f}")

        big_run = ours_big(ours_port, secret, rows)
        big_ours, big_raw = compare(
            f"852 KB batch each way ({ROWS} x {FIELDS} x {DIM} float32)",
            big_run,
            raw_echo(raw_port, big_frame),
            args.seconds,
            args.rounds,
        )
        mb = 2 * rows.nbytes / 1e6
        print(f"  ours {big_ours * 1e3:8.3f} ms per round trip   ({mb / big_ours:7.0f} MB/s)")
        print(f"  raw  {big_raw * 1e3:8.3f} ms per round trip   ({mb / big_raw:7.0f} MB/s)")
        ratio = big_ours / big_raw
        verdict = "meets" if ratio <= 1.5 else "MISSES"
        print(f"  ratio ours/raw: {ratio:.2f}  ({verdict} the 1.5x target)")

        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(big_run, 500)
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
