#!/usr/bin/env python3
"""Where a compact trace's compressed bytes go (issue #36): re-encodes the event records of a
trace the way format/compact.h does (version 5) and reports, per field, its raw bytes, its size
compressed alone (zstd -3), and what the interleaved event stream saves at zstd -3 without it.
A model of the encoder, not the encoder (the kind and flags bytes are numbered in order of
appearance): its stream is within a few percent of a real compact file's event frames.
    scripts/trace-field-bytes.py TRACE [GPUHEAP=build/gpuheap]
"""
import collections
import subprocess
import sys

M = (1 << 64) - 1
EVENTS = ("alloc", "free", "free_completed", "segment_alloc", "segment_free")


def zlen(b, level=3):
    return len(subprocess.run(["zstd", f"-{level}", "-c"], input=bytes(b), capture_output=True, check=True).stdout)


def var(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def zz(d):
    d &= M
    s = d - (1 << 64) if d >> 63 else d
    return var(((s << 1) ^ (s >> 63)) & M)


def encode(lines):
    """The events' fields, one list of (field, bytes) per event, in compact.h's order."""
    st = {"ts": 0, "ptr": 0, "tid": 0}
    allocs, frees, events = [], [], []
    small = collections.defaultdict(lambda: len(small))  # kind / flags names -> a byte
    for line in lines:
        parts = line.split()
        if not parts or parts[0] not in EVENTS:
            continue
        t = parts[0]
        f = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        ev = [("type", bytes([0x80 | EVENTS.index(t)])), ("len", b"\0")]
        put = lambda k, b: ev.append((k, b))  # noqa: E731
        ts, ptr, dev = int(f["ts"]), int(f["ptr"], 16), int(f["device"])
        kind = f.get("kind", "pooled")
        put("ts", zz(ts - st["ts"]))
        st["ts"] = ts

        def put_ptr():
            put("ptr", zz(ptr - st["ptr"]))
            st["ptr"] = ptr

        if t in ("alloc", "free"):
            tid = int(f["tid"])
            put("tid", zz(tid - st["tid"]))
            st["tid"] = tid
        if t == "alloc":
            put("device", zz(dev))
            put("kind_flags", bytes([small[kind], small[f["flags"]]]))
            put_ptr()
            req, size = int(f["requested"]), int(f["size"])
            put("requested", var(req))
            put("size", zz(size - req))
            put("stream", var(int(f["stream"], 16)))
            put("stack", var(int(f["stack"])))
            allocs.insert(0, (ptr, size, f["stream"], dev, kind))
            del allocs[32:]
        elif t == "free":
            put("kind_flags", bytes([small[f["flags"]]]))
            size = int(f["size"])
            i = next((i for i, a in enumerate(allocs) if a[0] == ptr), -1)
            if i >= 0:
                a = allocs.pop(i)
                other = (dev != a[3]) | ((kind != a[4]) << 1) | ((size != a[1]) << 2) | ((f["stream"] != a[2]) << 3)
                put("ref", bytes([i, other]))
                if other & 1:
                    put("device", zz(dev))
                if other & 2:
                    put("kind_flags", bytes([small[kind]]))
                if other & 4:
                    put("size", var(size))
                if other & 8:
                    put("stream", var(int(f["stream"], 16)))
            else:
                put("ref", b"\xff")
                put("device", zz(dev))
                put("kind_flags", bytes([small[kind]]))
                put_ptr()
                put("size", var(size))
                put("stream", var(int(f["stream"], 16)))
            put("stack", var(int(f["stack"])))
            frees.insert(0, (ptr, size, dev))
            del frees[16:]
        elif t == "free_completed":
            key = (ptr, int(f["size"]), dev)
            if key in frees:
                put("ref", bytes([frees.index(key)]))
                frees.remove(key)
            else:
                put("ref", b"\xff")
                put("device", zz(dev))
                put_ptr()
                put("size", var(key[1]))
        else:
            put("device", zz(dev))
            put("kind_flags", bytes([small[f.get("flags", "-")]]))
            put_ptr()
            put("size", var(int(f["size"])))
        ev[1] = ("len", bytes([sum(len(b) for _, b in ev[2:])]))
        events.append(ev)
    return events


def main():
    trace = sys.argv[1]
    gh = sys.argv[2] if len(sys.argv) > 2 else "build/gpuheap"
    dump = subprocess.run([gh, "dump", "-q", trace], capture_output=True, text=True, check=True).stdout
    events = encode(dump.splitlines())
    n = len(events)
    whole = b"".join(b for ev in events for _, b in ev)
    fields = sorted({k for ev in events for k, _ in ev})
    base = zlen(whole)
    print(f"{n} events: raw {len(whole) / n:.2f} B/event, zstd -3 {base / n:.2f}, zstd -19 {zlen(whole, 19) / n:.2f}")
    print(f"{'field':<11} {'raw':>6} {'alone':>6} {'saved':>6}   (B/event: raw; zstd -3 of the field's bytes alone;"
          " zstd -3 of the stream without it, subtracted from the whole)")
    alone_sum = 0
    for k in fields:
        col = b"".join(b for ev in events for f, b in ev if f == k)
        rest = b"".join(b for ev in events for f, b in ev if f != k)
        alone = zlen(col)
        alone_sum += alone
        print(f"{k:<11} {len(col) / n:>6.2f} {alone / n:>6.2f} {(base - zlen(rest)) / n:>6.2f}")
    print(f"each field compressed alone, summed: {alone_sum / n:.2f} B/event")
    ts = b"".join(b for ev in events for f, b in ev if f == "ts")
    rest = b"".join(b for ev in events for f, b in ev if f != "ts")
    print(f"times in their own stream, the rest interleaved: {(zlen(ts) + zlen(rest)) / n:.2f} B/event")


if __name__ == "__main__":
    main()
