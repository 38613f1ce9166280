#!/usr/bin/env python3
"""Receives frames on interfaces and records when each arrived.

Usage: paced-recv.py OUT IFACE...

Prints `ready` once it listens on every interface. On SIGTERM it writes
OUT, a sequence of records, little endian: u64 arrival time (the kernel's
receive timestamp, ns since the Unix epoch), u32 index of the interface
in the arguments, u32 frame length, the frame's bytes; then prints
`done <frames>`.
"""

import select, signal, socket, struct, sys

ETH_P_ALL = 0x0003
# Linux's value; Python names it only from 3.12 on.
SO_TIMESTAMPNS = getattr(socket, 'SO_TIMESTAMPNS', 35)
stop = False


def on_term(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
socks = []
for name in sys.argv[2:]:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind((name, 0))
    s.setblocking(False)
    socks.append(s)
print('ready', flush=True)
got = []
while not stop:
    try:
        readable, _, _ = select.select(socks, [], [], 0.1)
    except InterruptedError:
        continue
    for s in readable:
        which = socks.index(s)
        while True:
            try:
                data, anc, _, _ = s.recvmsg(65535, 64)
            except BlockingIOError:
                break
            except OSError as e:
                # Say which interface failed (e.g. ENETDOWN: it went down).
                sys.exit(f'paced-recv.py: receiving on {sys.argv[2 + which]}: {e}')
            ns = 0
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack('=qq', value[:16])
                    ns = sec * 1_000_000_000 + nsec
            got.append((ns, which, data))
with open(sys.argv[1], 'wb') as f:
    for ns, which, data in got:
        f.write(struct.pack('<QII', ns, which, len(data)))
        f.write(data)
print('done', len(got), flush=True)
