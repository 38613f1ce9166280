"""Write Sluice network functions in Python.

An NF is a class with ``init(self, config: bytes) -> NfInfo`` and
``process(self, batch: Batch) -> None`` (and optionally
``expired(self, table: int, entries: bytes) -> None``), exported at the end
of the NF's module with ``Nf = export(MyNf)``. The host calls ``init`` once
per instance with the tenant's configuration and ``process`` once per batch
of packets, never once per packet. Inside ``process``, :class:`Batch` gives
packet views, per-flow state (including changes made earlier in the same
batch) and setters for verdicts, rewrites and state; none of them calls the
host. Raise an exception to refuse a configuration or fail a batch: its
message goes to the host, which applies the NF's failure policy.

The contract is ``wit/v0.7.0/nf.wit`` (``sluice:nf@0.7.0``); componentize-py
generates the ``wit_world`` bindings this package wraps when it builds the NF.
A batch comes in as one frame of bytes and its answer goes back as one (no
record per rewrite, state change or offload request crosses the boundary).
"""

from __future__ import annotations

import math
import re
import struct
from array import array
from itertools import chain, repeat
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host_log
from wit_world.imports import offload as _offload
from wit_world.imports import state as _state
from wit_world.imports import types

__all__ = [
    "DROP", "NO_FLOW", "NO_L3", "NO_L4", "TCP_ACK", "TCP_FIN", "TCP_RST", "TCP_SYN",
    "Admission", "Batch", "Bytes", "Counters", "EndReason", "Level", "Merge", "NfInfo", "OffloadError", "Packet", "Pool",
    "ScanPage", "StateError", "frame", "unframe",
    "OffloadReturn", "decrement_ttl", "offload_now", "revoke", "revoke_all", "set_destination", "set_dscp",
    "set_source",
    "config_bool", "config_float", "config_int", "config_str", "config_value", "csum_update16", "export",
    "forward", "label", "log", "parse_ipv4_cidr", "emit", "stateless", "with_flow_state",
]

#: Drop the packet.
DROP = 0
#: The flow index of a packet that has no flow (not IP).
NO_FLOW = 0xFFFF
NO_L4 = 0xFFFF
NO_L3 = 0xFF
FLAG_REVERSE, FLAG_FRAGMENT, FLAG_TRUNCATED, FLAG_IPV6 = 1, 2, 4, 8
TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x01, 0x02, 0x04, 0x10

Level = types.Level
NfInfo = types.NfInfo
#: How the replicas of an eventual table combine: ``Merge.SUM``, ``Merge.MAX``, ``Merge.MIN``.
Merge = _state.Merge


#: ``forward(0)``, every packet's verdict until the NF sets another.
_FORWARD_0 = 1 << 16


def forward(port: int = 0) -> int:
    """Verdict: forward the packet out of ``port`` (0: the default output)."""
    return (1 << 16) | (port & 0xFFFF)


def label(value: int) -> int:
    """Verdict: send the packet to the chain branch selected by ``value``."""
    return (2 << 16) | (value & 0xFFFF)


def stateless() -> NfInfo:
    """What a stateless NF returns from ``init``."""
    return NfInfo(wants_flow_state=False, flow_idle_timeout_ns=0)


def with_flow_state(idle_timeout_ns: int = 0) -> NfInfo:
    """What an NF that keeps per-flow state returns from ``init`` (idle
    timeout 0: the host's default, 120 s)."""
    return NfInfo(wants_flow_state=True, flow_idle_timeout_ns=idle_timeout_ns)


def log(level: Level, message: str) -> None:
    """A line in the host log (rate-limited by the host)."""
    host_log.log(level, message)


def emit(events: Sequence[Tuple[str, Level, Sequence[Tuple[str, str]]]]) -> None:
    """Sends events now, in one call, outside a batch (e.g. from
    ``expired``): each a (kind, level, fields) tuple."""
    if events:
        host_log.emit([types.Event(kind, level, None, list(fields)) for kind, level, fields in events])


def config_value(config: bytes, key: str) -> Optional[str]:
    """The value of ``key`` in a config of ``key=value`` lines (spaces
    around both ignored, ``#`` starts a comment line), or None."""
    for line in config.decode("utf-8").splitlines():
        line = line.strip()
        if line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        if k.strip() == key:
            return v.strip()
    return None


def config_str(config: bytes, key: str, default: str = "") -> str:
    """The value of ``key`` as a string, or ``default`` when the config has
    no such key (an empty value, ``key =``, is ``""``)."""
    v = config_value(config, key)
    return default if v is None else v


_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def config_int(config: bytes, key: str, default: int = 0) -> int:
    """The value of ``key`` as an integer, or ``default`` when the config has
    no such key. The value is decimal digits with an optional sign
    (``30000``, ``-7``, ``+3``) that fit a signed 64-bit integer; nothing
    else is accepted, so every SDK reads a config the same way. ValueError
    otherwise, naming the key and the value (``capacity = 12k: not an
    integer``, ``...: integer out of range``): raised in ``init``, it
    refuses the configuration with that message."""
    v = config_value(config, key)
    if v is None:
        return default
    if not _INT.fullmatch(v):
        raise ValueError(f"{key} = {v}: not an integer")
    n = int(v)
    if not -(1 << 63) <= n < (1 << 63):
        raise ValueError(f"{key} = {v}: integer out of range")
    return n


def config_float(config: bytes, key: str, default: float = 0.0) -> float:
    """The value of ``key`` as a float, or ``default`` when the config has no
    such key. The value is a decimal number with an optional sign, fraction
    and exponent (``1.5``, ``.5``, ``2e-3``, ``3``); ``inf``, ``nan``,
    hexadecimal, underscores and values too large for a double raise
    ValueError (``rate = fast: not a number``)."""
    v = config_value(config, key)
    if v is None:
        return default
    f = float(v) if _FLOAT.fullmatch(v) else math.nan
    if not math.isfinite(f):
        raise ValueError(f"{key} = {v}: not a number")
    return f


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def config_bool(config: bytes, key: str, default: bool = False) -> bool:
    """The value of ``key`` as a boolean, or ``default`` when the config has
    no such key: ``true``, ``yes``, ``on``, ``1`` are True and ``false``,
    ``no``, ``off``, ``0`` False, in any case; anything else raises
    ValueError (``log = maybe: not a boolean (true/false, yes/no, on/off,
    1/0)``)."""
    v = config_value(config, key)
    if v is None:
        return default
    word = v.lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"{key} = {v}: not a boolean (true/false, yes/no, on/off, 1/0)")


def parse_ipv4_cidr(text: str) -> Tuple[int, int]:
    """``a.b.c.d[/n]`` as (network, mask) integers; ValueError if malformed."""
    addr, _, length = text.partition("/")
    parts = addr.split(".")
    if len(parts) != 4 or not all(p.isdigit() and len(p) <= 3 and int(p) <= 255 for p in parts):
        raise ValueError(f"bad IPv4 address in '{text}'")
    n = int(length) if length else 32
    if not length.isdigit() and length or n > 32:
        raise ValueError(f"bad prefix length in '{text}'")
    a = (int(parts[0]) << 24) | (int(parts[1]) << 16) | (int(parts[2]) << 8) | int(parts[3])
    mask = 0 if n == 0 else (0xFFFFFFFF << (32 - n)) & 0xFFFFFFFF
    return a & mask, mask


def csum_update16(checksum: int, old: int, new: int) -> int:
    """RFC 1624 incremental update of a one's-complement checksum when a
    16-bit word changes from ``old`` to ``new``."""
    s = (~checksum & 0xFFFF) + (~old & 0xFFFF) + new
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


_U32 = struct.Struct("!I")
_U32LE = struct.Struct("<I")
_U16 = struct.Struct("!H")
_TRAILER = struct.Struct("<IIII")  # a batch frame's packets, data, flow-state and return bytes
# The result frame (sluice:nf@0.7.0): a record's index and length, an
# offload request's 40-byte head, a header change's 24 bytes, the trailer.
_RECORD = struct.Struct("<II")
_OFFLOAD_HEAD = struct.Struct("<IBBHQQQQ")
_OFFLOAD_OP = struct.Struct("<BBBBHH16s")
_RESULT_TRAILER = struct.Struct("<IIII")
# A return of an ended offload entry in the batch frame (72 bytes).
_RETURN = struct.Struct("<QQQIBBH37s3x")


class Packet:
    """One packet of a batch: its bytes and what the host parsed out of
    them. Accessors return 0/False/None when a header was not captured.

    The interpreter inside the component pays for every attribute a packet
    stores and every call an accessor makes, so a batch makes its packets
    from columns of the descriptors sliced in C, a packet stores only the
    fields most NFs read, and each accessor reads the frame in one call."""

    __slots__ = ("flow", "flags", "l3_offset", "l4_offset", "wire_len", "_start", "_batch", "_index")

    def __init__(self, flow: int, flags: int, l3_offset: int, l4_offset: int, wire_len: int, start: int,
                 batch: "Batch", index: int):
        #: The index of the packet's flow among the batch's flows (NO_FLOW: not IP).
        self.flow = flow
        #: FLAG_REVERSE, FLAG_FRAGMENT, FLAG_TRUNCATED, FLAG_IPV6.
        self.flags = flags
        #: The IP header's offset in ``data`` (NO_L3: none).
        self.l3_offset = l3_offset
        #: The TCP/UDP/ICMP header's offset in ``data`` (NO_L4: none, cut
        #: off, or a later fragment); the host sets it only when the whole
        #: header was captured.
        self.l4_offset = l4_offset
        #: The packet's length on the wire (more than ``len(data)`` when the
        #: capture was truncated).
        self.wire_len = wire_len
        self._start = start
        self._batch = batch
        self._index = index

    @property
    def data(self) -> bytes:
        """The packet's bytes (a copy made on each read)."""
        return self._batch._data[self._start:self._batch._ends[self._index]]

    @property
    def timestamp_ns(self) -> int:
        """Arrival time in nanoseconds since the Unix epoch."""
        return self._batch._words[4 * self._index + 1]

    @property
    def flow_hash(self) -> int:
        """A hash of the direction-normalized 5-tuple; 0 without a flow."""
        return self._batch._words[4 * self._index + 2]

    @property
    def ingress_port(self) -> int:
        return self._batch._words16[16 * self._index + 13]

    def _ipv4(self) -> int:
        """The frame offset of the packet's IPv4 header when the whole
        header was captured, else -1: the host sets ``l3_offset`` only
        behind a whole, well-formed IP header (``sluice:nf@0.7.0``)."""
        l3 = self.l3_offset
        if l3 == NO_L3 or self.flags & FLAG_IPV6:
            return -1
        return self._start + l3

    def is_ipv4(self) -> bool:
        """An IPv4 packet whose whole IP header was captured."""
        return self._ipv4() >= 0

    def ip_proto(self) -> int:
        """The IP protocol (for IPv6 the first next header); 0 if not IP."""
        l3 = self.l3_offset
        if l3 == NO_L3:
            return 0
        return self._batch._data[self._start + l3 + (6 if self.flags & FLAG_IPV6 else 9)]

    def ipv4_src(self) -> int:
        """IPv4 source address as an integer (0 if not IPv4)."""
        at = self._ipv4()
        return _U32.unpack_from(self._batch._data, at + 12)[0] if at >= 0 else 0

    def ipv4_dst(self) -> int:
        """IPv4 destination address as an integer (0 if not IPv4)."""
        at = self._ipv4()
        return _U32.unpack_from(self._batch._data, at + 16)[0] if at >= 0 else 0

    def is_ipv6(self) -> bool:
        """An IPv6 packet whose fixed 40-byte IP header was captured."""
        return self.l3_offset != NO_L3 and self.flags & FLAG_IPV6 != 0

    def ipv6_src(self) -> Optional[bytes]:
        """IPv6 source address: its 16 bytes in network order (None if not IPv6)."""
        at = self._start + self.l3_offset
        return self._batch._data[at + 8:at + 24] if self.is_ipv6() else None

    def ipv6_dst(self) -> Optional[bytes]:
        """IPv6 destination address: its 16 bytes in network order (None if not IPv6)."""
        at = self._start + self.l3_offset
        return self._batch._data[at + 24:at + 40] if self.is_ipv6() else None

    def _l4_proto(self) -> int:
        """The IP protocol of a packet whose transport header the host
        found (for IPv6 the first next header), else -1: one read, since the
        host sets ``l4_offset`` only behind a whole IP header."""
        if self.l4_offset == NO_L4 or self.l3_offset == NO_L3:
            return -1
        return self._batch._data[self._start + self.l3_offset + (6 if self.flags & FLAG_IPV6 else 9)]

    def is_tcp(self) -> bool:
        """A TCP packet whose whole TCP header was captured."""
        if self.l4_offset == NO_L4 or self.l3_offset == NO_L3:
            return False
        return self._batch._data[self._start + self.l3_offset + (6 if self.flags & FLAG_IPV6 else 9)] == 6

    def is_udp(self) -> bool:
        """A UDP packet whose UDP header was captured."""
        if self.l4_offset == NO_L4 or self.l3_offset == NO_L3:
            return False
        return self._batch._data[self._start + self.l3_offset + (6 if self.flags & FLAG_IPV6 else 9)] == 17

    def src_port(self) -> int:
        proto = self._l4_proto()
        return _U16.unpack_from(self._batch._data, self._start + self.l4_offset)[0] if proto in (6, 17) else 0

    def dst_port(self) -> int:
        proto = self._l4_proto()
        return _U16.unpack_from(self._batch._data, self._start + self.l4_offset + 2)[0] if proto in (6, 17) else 0

    def tcp_flags(self) -> int:
        """TCP flags byte (TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK, ...), 0 if not TCP."""
        l4, l3 = self.l4_offset, self.l3_offset
        if l4 == NO_L4 or l3 == NO_L3:
            return 0
        f, start = self._batch._data, self._start
        if f[start + l3 + (6 if self.flags & FLAG_IPV6 else 9)] != 6:
            return 0
        return f[start + l4 + 13]

    def __repr__(self) -> str:
        return f"Packet(index={self._index}, flow={self.flow}, wire_len={self.wire_len})"


class Batch:
    """A batch of packets with their flow state, plus the NF's decisions.
    Every packet starts with the verdict ``forward(0)``."""

    def __init__(self, frame: bytes):
        # The batch frame (sluice:nf@0.7.0): packet bytes, padding to 8,
        # 32-byte descriptors, flow states, and a 16-byte trailer that
        # says how long each part is.
        size = len(frame)
        if size < 16:
            raise ValueError(f"batch frame of {size} bytes: shorter than its 16-byte trailer")
        n, data_len, states_len, returns_len = _TRAILER.unpack_from(frame, size - 16)
        first = (data_len + 7) & ~7
        at = first + 32 * n
        if at + states_len + returns_len + 16 != size or returns_len % _RETURN.size:
            raise ValueError(f"batch frame of {size} bytes: its trailer says {n} packets, "
                             f"{data_len} data bytes, {states_len} flow-state bytes, "
                             f"{returns_len} return bytes")
        self._returns_at = at + states_len
        self._returns_len = returns_len
        self._data = frame
        # The descriptors, read as words of 64, 32 and 16 bits and as
        # bytes: a packet's fields come out of columns sliced in C, never
        # out of Python shifts and masks on 64-bit integers.
        desc = memoryview(frame)[first:at]
        self._words = desc.cast("Q")
        self._words32 = desc.cast("I")
        self._words16 = desc.cast("H")
        self._ends = self._words32[0::8].tolist()
        self._desc = desc
        self._packets: Optional[List[Packet]] = None
        self.verdicts = [_FORWARD_0] * n
        self._rewrites: dict = {}
        self._events: list = []
        # Each flow's state as this batch sees it (None: none), and the
        # flows whose state the NF set or removed.
        states: list = []
        end = at + states_len
        append, length_at = states.append, _U32LE.unpack_from
        while at + 4 <= end:
            (length,) = length_at(frame, at)
            at += 4
            if length > end - at:
                break
            append(frame[at:at + length] if length else None)
            at += length
        self._states = states
        self._changed: dict = {}
        self._offloads: list = []
        self._returns: Optional[list] = None

    def __len__(self) -> int:
        return len(self.verdicts)

    def packets(self) -> List[Packet]:
        """All packets in order (made once per batch)."""
        packets = self._packets
        if packets is None:
            ends, desc, words16 = self._ends, self._desc, self._words16
            packets = self._packets = list(map(
                Packet, words16[12::16].tolist(), desc[31::32].tolist(), desc[30::32].tolist(),
                words16[14::16].tolist(), self._words32[1::8].tolist(), chain((0,), ends), repeat(self),
                range(len(ends))))
        return packets

    def packet(self, i: int) -> Packet:
        """Packet ``i`` (0 <= i < len(batch))."""
        if not 0 <= i < len(self.verdicts):
            raise IndexError(f"packet {i} of a batch of {len(self.verdicts)}")
        return self.packets()[i]

    def set_verdict(self, i: int, verdict: int) -> None:
        self.verdicts[i] = verdict

    def flow_state(self, flow: int) -> Optional[bytes]:
        """The state of ``flow`` as of now: what the host handed in, or what
        this batch set since; None if it has none."""
        states = self._states
        return states[flow] if 0 <= flow < len(states) else None

    def set_flow_state(self, flow: int, state: bytes) -> None:
        """Stores ``state`` (1..4096 bytes) for ``flow``."""
        if 0 <= flow < len(self._states):
            value = bytes(state) or None
            self._states[flow] = value
            self._changed[flow] = value

    def remove_flow_state(self, flow: int) -> None:
        """Forgets the state of ``flow``."""
        if 0 <= flow < len(self._states):
            self._states[flow] = None
            self._changed[flow] = None

    def rewrite(self, i: int, data: bytes) -> None:
        """Replaces the bytes of packet ``i``."""
        if 0 <= i < len(self.verdicts):
            self._rewrites[i] = bytes(data)

    def emit(self, kind: str, level: Level, packet: Optional[int], fields: Sequence[Tuple[str, str]]) -> None:
        """Queues an event; a batch's events reach the host in one call."""
        self._events.append(types.Event(kind, level, packet, list(fields)))

    def _flush_events(self) -> None:
        """Sends the queued events (also when the batch failed, as the other
        SDKs do: events emitted before a failure are delivered)."""
        if self._events:
            host_log.emit(self._events)
            self._events = []

    def offload(self, i: int, *, rewrites: Sequence = (), idle_timeout_ns: int = 0, max_packets: int = 0,
                max_bytes: int = 0, max_age_ns: int = 0, counts: bool = True) -> None:
        """Offloads the flow of packet ``i`` (flow offload, ``sluice:nf@0.5.0``):
        its later packets in its direction get this packet's verdict, plus
        ``rewrites`` (:func:`set_source`, :func:`set_destination`,
        :func:`decrement_ttl`, :func:`set_dscp`; at most 8), without a call
        to the NF, until a TCP FIN or RST (that packet comes to the NF),
        ``idle_timeout_ns`` without a packet (0: the NF's flow idle
        timeout), ``max_packets``, ``max_bytes`` or ``max_age_ns`` (0: no
        limit), a revoke, or a new version. With ``counts`` (the default)
        what passed under the entry comes back through
        :meth:`offload_returns`; an NF that counts nothing per packet passes
        ``counts=False``. The requests go to the host in one call when
        ``process`` returns; a refused one simply makes no entry (call
        :func:`offload_now` to see refusals)."""
        # One more change than allowed is enough for the host to refuse.
        ops = b"".join(rewrites[:9]) if rewrites else b""
        self._offloads.append(_OFFLOAD_HEAD.pack(
            i, len(ops) // _OFFLOAD_OP.size, 1 if counts else 0, 0, idle_timeout_ns, max_packets, max_bytes,
            max_age_ns) + ops)

    def offload_returns(self) -> list:
        """What passed under this NF's offload entries that ended since the
        last batch, one ``OffloadReturn`` per entry: ``flow`` (the flow's
        index in this batch when a packet of it is here, else None),
        ``flow_hash``, ``key``, ``reverse``, ``packets``, ``bytes`` and
        ``reason`` (an :class:`EndReason` value). Add them to whatever the NF
        counts per packet. They come with the batch (also entries carried
        here from another host with their flows); each is handed in once."""
        returns = self._returns
        if returns is None:
            at, frame = self._returns_at, self._data
            returns = self._returns = [OffloadReturn(*_RETURN.unpack_from(frame, at + k))
                                       for k in range(0, self._returns_len, _RETURN.size)]
        return returns

    def _finish(self) -> bytes:
        """The result frame: verdicts, rewrites, flow-state changes, offload
        requests and the trailer (``wit/v0.7.0/nf.wit``, ``nf.process``)."""
        self._flush_events()
        verdicts = array("I", self.verdicts).tobytes()
        record = _RECORD.pack
        rewrites = b"".join([record(i, len(d)) + d for i, d in sorted(self._rewrites.items())])
        updates = b"".join([record(f, 0) if v is None else record(f, len(v)) + v
                            for f, v in sorted(self._changed.items())])
        offloads = b"".join(self._offloads)
        return b"".join((verdicts, rewrites, updates, offloads, _RESULT_TRAILER.pack(
            len(self.verdicts), len(rewrites), len(updates), len(offloads))))


class EndReason:
    """Why an offload entry ended (``OffloadReturn.reason``)."""
    #: A TCP FIN or RST of its flow and direction (that packet is in the batch).
    CLOSED = 0
    #: Its packet, byte or age limit, or a TTL too low to lower.
    LIMIT = 1
    #: No packet for its idle timeout.
    IDLE = 2
    #: :func:`revoke` or :func:`revoke_all`.
    REVOKED = 3
    #: The NF was replaced (a new version or configuration) or stopped.
    REPLACED = 4


class OffloadReturn:
    """What passed under an offload entry that ended: ``flow`` (the flow's
    index in this batch when a packet of it is here, else None),
    ``flow_hash``, ``key`` (the normalized 5-tuple, 37 bytes), ``reverse``,
    ``packets``, ``bytes`` and ``reason`` (an :class:`EndReason` value)."""

    __slots__ = ("flow_hash", "packets", "bytes", "flow", "reverse", "reason", "key")

    def __init__(self, flow_hash: int, packets: int, nbytes: int, flow: int, reverse: int, reason: int, _zero: int,
                 key: bytes):
        self.flow_hash, self.packets, self.bytes = flow_hash, packets, nbytes
        self.flow = None if flow == 0xFFFFFFFF else flow
        self.reverse, self.reason, self.key = reverse != 0, reason, key


def _op(kind: int, address: bytes = b"", port: Optional[int] = None, dscp: int = 0) -> bytes:
    # An address of another length than 4 or 16 is the host's to refuse.
    address = bytes(address)
    return _OFFLOAD_OP.pack(kind, min(len(address), 255), port is not None, dscp, port or 0, 0, address)


def set_source(address: bytes, port: Optional[int] = None) -> bytes:
    """An offload change: later packets get this sender address (4 or 16
    bytes) and, for TCP and UDP, ``port`` (None: the port stays)."""
    return _op(0, address, port)


def set_destination(address: bytes, port: Optional[int] = None) -> bytes:
    """An offload change: later packets get this receiver address and port."""
    return _op(1, address, port)


def decrement_ttl() -> bytes:
    """An offload change: later packets' TTL or hop limit is lowered by one."""
    return _op(2)


def set_dscp(dscp: int) -> bytes:
    """An offload change: later packets get this DSCP (0 to 63)."""
    # Above 63 is the host's to refuse.
    return _op(3, dscp=dscp if 0 <= dscp <= 255 else 255)


def _request_record(request: bytes):
    """An offload request of the result frame as the ``offload`` call takes it."""
    packet, n, flags, _, idle, max_packets, max_bytes, max_age = _OFFLOAD_HEAD.unpack_from(request)
    ops = []
    for k in range(n):
        kind, length, has_port, dscp, port, _, address = _OFFLOAD_OP.unpack_from(request, _OFFLOAD_HEAD.size + 24 * k)
        if kind in (0, 1):
            e = _offload.Endpoint(address[:length], port if has_port else None)
            ops.append(_offload.RewriteOp_Source(e) if kind == 0 else _offload.RewriteOp_Destination(e))
        elif kind == 2:
            ops.append(_offload.RewriteOp_DecrementTtl())
        else:
            ops.append(_offload.RewriteOp_SetDscp(dscp))
    return _offload.OffloadRequest(packet, ops, idle, max_packets, max_bytes, max_age, bool(flags & 1))


class OffloadError(Exception):
    """Why the host made no entry for an offload request: ``kind`` is
    ``not-now``, ``bad-packet``, ``not-offloadable``, ``bad-rewrite`` or
    ``over-budget``; ``detail`` says more for the two that carry text."""

    def __init__(self, kind: str, detail: Optional[str] = None):
        self.kind, self.detail = kind, detail
        super().__init__(f"offload: {kind}" + (f": {detail}" if detail else ""))


_OFFLOAD_ERRORS = {
    "OffloadError_NotNow": "not-now", "OffloadError_BadPacket": "bad-packet",
    "OffloadError_NotOffloadable": "not-offloadable", "OffloadError_BadRewrite": "bad-rewrite",
    "OffloadError_OverBudget": "over-budget",
}


def offload_now(batch: "Batch") -> list:
    """Sends ``batch``'s offload requests now instead of when ``process``
    returns: one result per request, None where an entry was made, else an
    :class:`OffloadError`."""
    requests, batch._offloads = batch._offloads, []
    if not requests:
        return []
    out = []
    for r in _offload.offload([_request_record(q) for q in requests]):
        e = r.value if isinstance(r, Err) else None
        if e is None:
            out.append(None)
        else:
            name = type(e).__name__
            detail = getattr(e, "value", None)
            out.append(OffloadError(_OFFLOAD_ERRORS.get(name, name), detail if isinstance(detail, str) else None))
    return out


class Admission:
    """Which flow directions have proved long enough to offload: a count of
    each direction's packets in the instance's own memory.

    An entry costs the host a request, an install and an end, which a flow
    that ends a few packets later does not repay where a call is cheap;
    ``admit`` is true once a direction has carried ``after`` packets the NF
    would have offloaded (0 and 1: at once), as flow caches admit only
    flows that have proved long. In an interpreted NF a call costs
    microseconds, so ``after=1`` usually pays. At most ``slots`` flows are
    counted (the oldest is forgotten first): a lost count only delays the
    entry. Nothing here changes a verdict."""

    __slots__ = ("after", "slots", "_counts")

    def __init__(self, after: int, slots: int = 4096):
        self.after = after
        self.slots = max(1, slots)
        self._counts: dict = {}

    def admit(self, p: Packet) -> bool:
        """Counts ``p`` in its flow's direction; True once that direction
        has carried ``after`` counted packets."""
        if self.after <= 1:
            return True
        key = (p._batch._words[4 * p._index + 2] << 1) | (p.flags & FLAG_REVERSE)
        n = self._counts.get(key, 0) + 1
        if n == 1 and len(self._counts) >= self.slots:
            del self._counts[next(iter(self._counts))]
        self._counts[key] = n
        return n >= self.after

    def forget(self, p: Packet) -> None:
        """Forgets the counts of ``p``'s flow (a new connection on its
        5-tuple)."""
        if self._counts:
            key = p._batch._words[4 * p._index + 2] << 1
            self._counts.pop(key, None)
            self._counts.pop(key | 1, None)


def revoke(flow_hashes: Sequence[int]) -> None:
    """Ends this worker's entries of the flows with these hashes
    (``Packet.flow_hash``), both directions, when the batch is done."""
    if flow_hashes:
        _offload.revoke(list(flow_hashes))


def revoke_all() -> None:
    """Ends every entry of this NF on this worker when the batch is done."""
    _offload.revoke_all()


class StateError(Exception):
    """A host table operation failed; nothing traps, the NF decides.

    - ``op``: the call (``"declare"``, ``"counter-add"``, ``"put-many"``, ...);
    - ``kind``: the contract's state-error case: ``"unknown-table"``,
      ``"not-now"``, ``"wrong-kind"``, ``"bad-spec"``, ``"incompatible"``,
      ``"bad-input"``, ``"full"``, ``"over-budget"`` or ``"too-large"``;
    - ``item``: for ``bad-input``, ``full``, ``over-budget`` and
      ``too-large``, the index of the item the call stopped at (the key of
      ``add``, the key-value entry of ``put_many``, the value of
      ``acquire``): the items before it were applied, it and the ones after
      it were not. None for the other cases;
    - ``detail``: the host's reason for ``bad-spec`` and ``incompatible``
      (None otherwise).
    """

    def __init__(self, op: str, kind: str, item: Optional[int] = None, detail: Optional[str] = None):
        self.op, self.kind, self.item, self.detail = op, kind, item, detail
        if detail is not None:
            message = f"{op}: {kind}: {detail}"
        elif item is not None:
            message = f"{op}: {kind} at item {item}"
        else:
            message = f"{op}: {kind}"
        super().__init__(message)


# The generated classes of the contract's state-error cases, by case.
_STATE_ERRORS = {
    "StateError_UnknownTable": "unknown-table", "StateError_NotNow": "not-now",
    "StateError_WrongKind": "wrong-kind", "StateError_BadSpec": "bad-spec",
    "StateError_Incompatible": "incompatible", "StateError_BadInput": "bad-input",
    "StateError_Full": "full", "StateError_OverBudget": "over-budget", "StateError_TooLarge": "too-large",
}
_ITEM_ERRORS = ("bad-input", "full", "over-budget", "too-large")


def _state_call(what: str, f, *args):
    try:
        return f(*args)
    except Err as e:
        kind = _STATE_ERRORS.get(type(e.value).__name__, type(e.value).__name__)
        value = getattr(e.value, "value", None)
        if kind in _ITEM_ERRORS:
            raise StateError(what, kind, item=value) from None
        if kind in ("bad-spec", "incompatible"):
            raise StateError(what, kind, detail=value) from None
        if kind == "unknown-table":
            raise StateError(what, kind, detail=f"table {value}") from None
        raise StateError(what, kind) from None


#: The most entries one ``scan`` page and one ``top_k`` hold (the host's bound).
SCAN_MAX = 1024


class ScanPage(NamedTuple):
    """One page of a table scan: ``entries`` in ascending key order, and the
    ``cursor`` to pass to the next ``scan`` (``b""`` when the scan is
    done). Counter tables: ``(key, value)`` integers; byte tables:
    ``(key, value)`` bytes; pools: ``(resource, value)``, an integer and
    bytes."""

    entries: list
    cursor: bytes


def _scan(table: int, cursor: bytes, limit: int):
    return _state_call("scan", _state.scan, table, bytes(cursor), limit)


def _pairs(framed: bytes) -> list:
    items = unframe(framed)
    return [(bytes(items[i]), bytes(items[i + 1])) for i in range(0, len(items) - 1, 2)]


def _walk(scan, limit: int) -> Iterator:
    cursor = b""
    while True:
        page = scan(cursor, limit)
        yield from page.entries
        cursor = page.cursor
        if not cursor:
            return


class Counters:
    """A host counter table (see the ``state`` interface of the contract)."""

    def __init__(self, table: int):
        self.table = table

    @staticmethod
    def declare(spec: _state.TableSpec) -> "Counters":
        """Declares a table from a full spec (only in ``init``)."""
        return Counters(_state_call("declare", _state.declare, spec))

    @staticmethod
    def sum(name: str, merge_interval_ns: int = 0, *, capacity: int = 0, idle_timeout_ns: int = 0,
            notify_expired: bool = False) -> "Counters":
        """A global counter table whose workers' replicas are summed every
        ``merge_interval_ns`` of packet time (only in ``init``): the same as
        ``Counters.eventual(name, Merge.SUM, merge_interval_ns, ...)``."""
        return Counters.eventual(name, Merge.SUM, merge_interval_ns, capacity=capacity,
                                 idle_timeout_ns=idle_timeout_ns, notify_expired=notify_expired)

    @staticmethod
    def eventual(name: str, merge: "Merge" = Merge.SUM, merge_interval_ns: int = 0, *, capacity: int = 0,
                 idle_timeout_ns: int = 0, notify_expired: bool = False) -> "Counters":
        """A global counter table, one replica per worker, merged with
        ``merge`` (``Merge.SUM``, ``Merge.MAX``: the largest value wins,
        ``Merge.MIN``) every ``merge_interval_ns`` of packet time (0: every
        batch); only in ``init``. For MAX and MIN tables, ``add`` offers its
        delta as a candidate value. ``capacity`` counts the whole table, over
        every worker."""
        return Counters.declare(_spec(name, _state.Scope.GLOBAL, _state.Access.READ_WRITE, _state.ValueKind.COUNTER,
                                      _state.Consistency_Eventual(_state.EventualSpec(merge, merge_interval_ns)), 8,
                                      idle_timeout_ns, notify_expired, capacity=capacity))

    @staticmethod
    def single_writer(name: str, sync_interval_ns: int = 0, *, capacity: int = 0, idle_timeout_ns: int = 0,
                      notify_expired: bool = False) -> "Counters":
        """A global counter table with one owner worker per key (only in
        ``init``): adds to keys another worker owns are forwarded to it as
        deltas, so none is lost; reads see the owner's value as published at
        its last sync plus this worker's own adds since. Owners sync every
        ``sync_interval_ns`` of packet time (0: every batch). ``capacity``
        counts the whole table, over every worker."""
        return Counters.declare(_spec(name, _state.Scope.GLOBAL, _state.Access.READ_WRITE, _state.ValueKind.COUNTER,
                                      _single_writer(sync_interval_ns), 8, idle_timeout_ns, notify_expired,
                                      capacity=capacity))

    @staticmethod
    def per_flow(name: str, *, capacity: int = 0, idle_timeout_ns: int = 0,
                 notify_expired: bool = False) -> "Counters":
        """Counters per flow, keyed by the batch's flow index (only in
        ``init``). ``capacity`` counts one worker's flows; with
        ``notify_expired``, counters idle for ``idle_timeout_ns`` of packet
        time reach the NF's ``expired`` (keys: 37-byte flow keys)."""
        return Counters.declare(_spec(name, _state.Scope.PER_FLOW, _state.Access.READ_WRITE, _state.ValueKind.COUNTER,
                                      _state.Consistency_Local(), 8, idle_timeout_ns, notify_expired,
                                      capacity=capacity))

    @staticmethod
    def read_only(name: str, *, capacity: int = 0, idle_timeout_ns: int = 0) -> "Counters":
        """Global counters written in ``init`` (with ``add``) and replicated to
        every worker; ``process`` only reads them (only in ``init``)."""
        return Counters.declare(_spec(name, _state.Scope.GLOBAL, _state.Access.READ_ONLY, _state.ValueKind.COUNTER,
                                      _state.Consistency_Local(), 8, idle_timeout_ns, capacity=capacity))

    def add(self, keys: Sequence[int], deltas: Sequence[int]) -> None:
        """Adds ``deltas[i]`` to the counter ``keys[i]`` (for MAX/MIN eventual
        tables: offers the value). StateError ``full``, ``over-budget`` or
        ``bad-input`` carries the index of the key it stopped at (``item``);
        keys before it were added."""
        _state_call("counter-add", _state.counter_add, self.table, list(keys), list(deltas))

    def get(self, keys: Sequence[int]) -> list:
        """Reads counters (0 for absent keys)."""
        return _state_call("counter-get", _state.counter_get, self.table, list(keys))

    def scan(self, cursor: bytes = b"", limit: int = 0) -> ScanPage:
        """One page of the table in ascending key order: up to ``limit``
        ``(key, value)`` pairs after ``cursor`` (``b""``: from the start;
        ``limit`` 0 or above 1024: 1024), and the cursor of the next page
        (``b""``: done). Per-flow tables refuse it (``wrong-kind``). Costs
        one state operation per entry plus one per call."""
        page = _scan(self.table, cursor, limit)
        return ScanPage([(int(k), int(v)) for k, v in page.counters], bytes(page.cursor))

    def items(self, limit: int = 0) -> Iterator[Tuple[int, int]]:
        """Every ``(key, value)`` of the table, in ascending key order, one
        ``scan`` page of ``limit`` at a time."""
        return _walk(self.scan, limit)

    def top_k(self, k: int) -> List[Tuple[int, int]]:
        """The ``k`` largest counters (``k`` at most 1024) as ``(key,
        value)``, largest first, equal values by ascending key, selected by
        the host without reading every key. Counts one state operation per
        pair plus one."""
        return [(int(key), int(v)) for key, v in _state_call("top-k", _state.top_k, self.table, k)]


def frame(items: Sequence[bytes]) -> bytes:
    """Frames items the way the state interface takes keys and values: a
    4-byte little-endian length, then the bytes, for each."""
    out = bytearray()
    for item in items:
        out += len(item).to_bytes(4, "little")
        out += item
    return bytes(out)


def unframe(data: bytes) -> list:
    """The items of a framed list (ValueError if it is cut short)."""
    items, at = [], 0
    while at < len(data):
        if at + 4 > len(data):
            raise ValueError(f"framing cut short at byte {at}")
        n = int.from_bytes(data[at:at + 4], "little")
        if at + 4 + n > len(data):
            raise ValueError(f"framing cut short at byte {at}")
        items.append(data[at + 4:at + 4 + n])
        at += 4 + n
    return items


def _spec(name, scope, access, kind, consistency, max_value_size, idle_timeout_ns=0, notify_expired=False,
          key_size=0, capacity=0):
    return _state.TableSpec(
        name=name, scope=scope, access=access, kind=kind, consistency=consistency, key_size=key_size,
        max_value_size=max_value_size, capacity=capacity, idle_timeout_ns=idle_timeout_ns,
        notify_expired=notify_expired)


def _single_writer(sync_interval_ns: int):
    return _state.Consistency_SingleWriter(_state.SingleWriterSpec(sync_interval_ns))


class Bytes:
    """A host byte table: framed keys and values (see ``frame``)."""

    def __init__(self, table: int):
        self.table = table

    @staticmethod
    def declare(spec: _state.TableSpec) -> "Bytes":
        """Declares a table from a full spec (only in ``init``)."""
        return Bytes(_state_call("declare", _state.declare, spec))

    @staticmethod
    def per_flow(name: str, max_value_size: int, idle_timeout_ns: int = 0, notify_expired: bool = False, *,
                 capacity: int = 0) -> "Bytes":
        """Byte values per flow, keyed by the batch's flow index (framed as
        4 bytes little-endian); only in ``init``. ``capacity`` counts one
        worker's flows. With ``notify_expired``, entries idle for
        ``idle_timeout_ns`` of packet time reach the NF's ``expired`` (keys:
        37-byte flow keys)."""
        return Bytes.declare(_spec(name, _state.Scope.PER_FLOW, _state.Access.READ_WRITE, _state.ValueKind.BYTES,
                                   _state.Consistency_Local(), max_value_size, idle_timeout_ns, notify_expired,
                                   capacity=capacity))

    @staticmethod
    def single_writer(name: str, key_size: int, max_value_size: int, sync_interval_ns: int = 0, *,
                      capacity: int = 0, idle_timeout_ns: int = 0, notify_expired: bool = False) -> "Bytes":
        """A global byte table with one owner worker per key (only in
        ``init``): writes to keys another worker owns are forwarded to it,
        and the last applied write wins (an empty value removes); reads see
        the owner's value as published at its last sync plus this worker's
        own writes since. ``key_size`` 0 allows keys of 1 to 256 bytes;
        owners sync every ``sync_interval_ns`` of packet time (0: every
        batch). ``capacity`` counts the whole table, over every worker."""
        return Bytes.declare(_spec(name, _state.Scope.GLOBAL, _state.Access.READ_WRITE, _state.ValueKind.BYTES,
                                   _single_writer(sync_interval_ns), max_value_size, idle_timeout_ns,
                                   notify_expired, key_size=key_size, capacity=capacity))

    @staticmethod
    def read_only(name: str, key_size: int, max_value_size: int, *, capacity: int = 0,
                  idle_timeout_ns: int = 0) -> "Bytes":
        """Global byte values written in ``init`` (with ``put_many``) and
        replicated to every worker; ``process`` only reads them (only in
        ``init``). ``key_size`` 0 allows keys of 1 to 256 bytes."""
        return Bytes.declare(_spec(name, _state.Scope.GLOBAL, _state.Access.READ_ONLY, _state.ValueKind.BYTES,
                                   _state.Consistency_Local(), max_value_size, idle_timeout_ns, key_size=key_size,
                                   capacity=capacity))

    def get_many(self, keys: bytes) -> bytes:
        """Reads values: ``keys`` framed, the result framed in the same order
        (an empty item for an absent key)."""
        return _state_call("get-many", _state.get_many, self.table, keys)

    def put_many(self, entries: bytes) -> None:
        """Writes framed key, value, key, value, ... (an empty value removes
        the key). StateError ``full``, ``over-budget``, ``too-large`` or
        ``bad-input`` carries the index of the key-value entry it stopped at
        (``item``); entries before it were written."""
        _state_call("put-many", _state.put_many, self.table, entries)

    def scan(self, cursor: bytes = b"", limit: int = 0) -> ScanPage:
        """One page of the table in ascending key order (bytewise): up to
        ``limit`` ``(key, value)`` pairs after ``cursor`` (``b""``: from the
        start; ``limit`` 0 or above 1024: 1024), and the cursor of the next
        page (``b""``: done). Per-flow tables refuse it (``wrong-kind``)."""
        page = _scan(self.table, cursor, limit)
        return ScanPage(_pairs(bytes(page.entries)), bytes(page.cursor))

    def items(self, limit: int = 0) -> Iterator[Tuple[bytes, bytes]]:
        """Every ``(key, value)`` of the table, in ascending key order, one
        ``scan`` page of ``limit`` at a time."""
        return _walk(self.scan, limit)


class Pool:
    """A release table: integer resources shared by the host's workers,
    each bound to a value while held."""

    def __init__(self, table: int):
        self.table = table

    @staticmethod
    def declare(name: str, first: int, count: int, max_value_size: int, chunk: int = 0) -> "Pool":
        """The resources ``first .. first + count``, each bound to a value of
        up to ``max_value_size`` bytes while held; a worker takes ``chunk``
        of them from the free list at a time (0: the host chooses). Only in
        ``init``. Pools hold at most ``count`` bindings and never expire."""
        spec = _spec(name, _state.Scope.GLOBAL, _state.Access.READ_WRITE, _state.ValueKind.BYTES,
                     _state.Consistency_Release(_state.PoolSpec(first, count, chunk)), max_value_size)
        return Pool(_state_call("declare", _state.declare, spec))

    def acquire(self, values: bytes) -> list:
        """Takes one resource per framed value, bound to it; fewer than asked
        when the whole pool is used up. StateError ``too-large`` or
        ``bad-input`` carries the index of the value (``item``)."""
        return _state_call("acquire", _state.acquire, self.table, values)

    def lookup(self, resources: Sequence[int]) -> bytes:
        """The values bound to resources, framed in order (empty: not held)."""
        return _state_call("lookup", _state.lookup, self.table, list(resources))

    def release(self, resources: Sequence[int]) -> None:
        """Gives resources back (one not held is ignored)."""
        _state_call("release", _state.release, self.table, list(resources))

    def scan(self, cursor: bytes = b"", limit: int = 0) -> ScanPage:
        """One page of the held resources on every worker, ascending: up to
        ``limit`` ``(resource, value)`` pairs after ``cursor`` (``b""``: from
        the start; ``limit`` 0 or above 1024: 1024), and the cursor of the
        next page (``b""``: done)."""
        page = _scan(self.table, cursor, limit)
        return ScanPage([(int.from_bytes(k, "little"), v) for k, v in _pairs(bytes(page.entries))],
                        bytes(page.cursor))

    def items(self, limit: int = 0) -> Iterator[Tuple[int, bytes]]:
        """Every held ``(resource, value)``, ascending, page by page."""
        return _walk(self.scan, limit)


def export(cls):
    """The component's ``nf`` export for the NF class ``cls``: assign it to
    ``Nf`` at the end of the NF module (``Nf = export(MyNf)``)."""

    class Nf(exports.Nf):
        _nf = None

        def init(self, config: bytes) -> types.NfInfo:
            try:
                nf = cls()
                info = nf.init(bytes(config))
            except Exception as e:  # the host shows the message to the tenant
                raise Err(str(e) or type(e).__name__)
            Nf._nf = nf
            return info if info is not None else stateless()

        def process(self, batch: bytes) -> bytes:
            if Nf._nf is None:
                raise Err("process called before a successful init")
            try:
                b = Batch(batch)
            except ValueError as e:
                raise Err(str(e))
            try:
                Nf._nf.process(b)
                return b._finish()
            except Exception as e:
                b._flush_events()
                raise Err(f"{type(e).__name__}: {e}")

        def expired(self, table: int, entries: bytes) -> None:
            handler = getattr(Nf._nf, "expired", None)
            if handler is None:
                return
            try:
                handler(table, bytes(entries))
            except Exception as e:
                raise Err(f"{type(e).__name__}: {e}")

    return Nf
