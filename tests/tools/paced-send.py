#!/usr/bin/env python3
"""Sends frames from a schedule file on an interface at their due times.

Usage: paced-send.py SCHEDULE IFACE

The schedule is a sequence of records, little endian: u64 due time in
microseconds from the start, u32 frame length, the frame's bytes. Prints
`start <unix time>` when it starts (the moment due times count from),
then `done <seconds taken> <frames sent more than 5 ms late>`.
"""

import socket, struct, sys, time
data = open(sys.argv[1], 'rb').read()
frames, off = [], 0
while off < len(data):
    due, n = struct.unpack_from('<QI', data, off)
    off += 12
    frames.append((due / 1e6, data[off:off + n]))
    off += n
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[2], 0))
t0 = time.monotonic()
print('start', repr(time.time()), flush=True)
late = 0
for due, f in frames:
    d = t0 + due - time.monotonic()
    if d > 0.002:
        time.sleep(d - 0.001)
    while t0 + due > time.monotonic():
        pass
    if time.monotonic() - (t0 + due) > 0.005:
        late += 1
    s.send(f)
print('done', round(time.monotonic() - t0, 3), late, flush=True)
