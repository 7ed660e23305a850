#!/usr/bin/env python3
"""The Python delay line ec-delayline replaced, kept as the baseline of its
throughput measurement (`netlab.py delayline-rate`): the same command line
(`--tun NAME:DELAY[:LOSS]`, `ready`, `NAME DELAY` lines on stdin), one
thread, select() over the TUN devices and a queue per device. Here it
carried 252-296 Mbit/s of TCP against ec-delayline's 1.15-1.23 Gbit/s
(docs/experiments.md; runtime-notes.md's 117 Mbit/s came from another,
simpler prototype), and its own latency under load is too uneven for the
testbed's calibration."""

import collections
import fcntl
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def parse_delay(text):
    for suffix, scale in (("us", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text) * 1e-3


def main(argv):
    links = {}
    args = iter(argv)
    for arg in args:
        if arg == "--tun":
            name, delay, *rest = next(args).split(":")
            links[name] = {"fd": open_tun(name), "delay": parse_delay(delay),
                           "loss": float(rest[0]) if rest else 0.0, "queue": collections.deque()}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    by_fd = {link["fd"]: link for link in links.values()}
    stdin = sys.stdin.fileno()
    while True:
        now = time.monotonic()
        due = [link["queue"][0][0] for link in links.values() if link["queue"]]
        timeout = max(0.0, min(due) - now) if due else 0.1
        readable, _, _ = select.select([*by_fd, stdin], [], [], timeout)
        for fd in readable:
            if fd == stdin:
                line = sys.stdin.readline().split()
                if len(line) == 2 and line[0] in links:
                    links[line[0]]["delay"] = parse_delay(line[1])
                continue
            link = by_fd[fd]
            packet = os.read(fd, 65536)
            if not link["loss"] or random.random() >= link["loss"]:
                link["queue"].append((time.monotonic() + link["delay"], packet))
        now = time.monotonic()
        for link in links.values():
            queue = link["queue"]
            while queue and queue[0][0] <= now:
                os.write(link["fd"], queue.popleft()[1])


if __name__ == "__main__":
    main(sys.argv[1:])
