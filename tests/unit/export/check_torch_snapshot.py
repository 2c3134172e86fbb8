#!/usr/bin/env python3
"""Checks a `gpuheap export --format torch-snapshot` pickle the way torch's viewers read it.

  check_torch_snapshot.py SNAPSHOT CSV [--segments N] [--blocks N]

SNAPSHOT is the pickle, CSV the `gpuheap export --format csv` of the same trace (the events
as recorded, replayed here independently). Checks: pickle protocol 2..4; the layout of
torch.cuda.memory._snapshot() (segments with blocks, device_traces with entries); each
segment's blocks tile it exactly (what _memory_viz.segsum asserts); its allocated/active/
requested sizes are its blocks' sums; replaying device_traces forward from nothing ends in
the final `segments` (the viewer replays them backwards from there); and the final state
equals the one replayed from the CSV. Exit 0 when all hold, 1 with the reasons otherwise.
"""
import csv
import pickle
import pickletools
import sys

errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)
    return cond


def check_backwards(snap, final, in_segs):
    """Replays device_traces backwards from the final segments, as memory_viz does."""
    segs = {a: (d, s) for a, (d, s, _) in final.items()}
    blks = dict(in_segs)
    for dev, entries in enumerate(snap["device_traces"]):
        for e in reversed(entries):
            a = e["action"]
            addr, size = e.get("device_free" if a == "oom" else "addr"), e["size"]
            if a == "alloc":
                check(blks.pop(addr, (0, ""))[1] == "active_allocated", f"backwards: alloc {addr:#x} not allocated after")
            elif a == "free_requested":
                check(blks.get(addr, (0, ""))[1] == "active_pending_free", f"backwards: free_requested {addr:#x}")
                blks[addr] = (size, "active_allocated")
            elif a == "free_completed":
                check(addr not in blks, f"backwards: free_completed {addr:#x} still a block after")
                blks[addr] = (size, "active_pending_free")
            elif a == "segment_alloc":
                check(segs.pop(addr, None) == (dev, size), f"backwards: segment_alloc {addr:#x} of no such segment")
            elif a == "segment_free":
                check(addr not in segs, f"backwards: segment_free {addr:#x} still a segment after")
                segs[addr] = (dev, size)


def main():
    args = sys.argv[1:]
    want = {}
    while len(args) > 2:
        k, v = args.pop(), args.pop()
        want[v.lstrip("-")] = int(k)
    snap_path, csv_path = args
    raw = open(snap_path, "rb").read()
    check(raw[0] == 0x80 and 2 <= raw[1] <= 4, f"pickle protocol {raw[1]} (0x80 {raw[0]:#x}): must be 2..4")
    snap = pickle.loads(raw)
    check(isinstance(snap, dict) and "segments" in snap and "device_traces" in snap, "top-level keys")
    frame_keys = {"filename", "line", "name"}

    def frames_ok(fr, where):
        if not check(isinstance(fr, list), f"{where}: frames is not a list"):
            return
        for f in fr:
            check(isinstance(f, dict) and set(f) == frame_keys, f"{where}: frame keys {sorted(f)}")
            check(isinstance(f["filename"], str) and isinstance(f["name"], str) and isinstance(f["line"], int),
                  f"{where}: frame types")

    seg_keys = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
    final = {}  # address -> (device, size, {block address: (size, state)})
    for s in snap["segments"]:
        where = f"segment {s.get('address', '?'):#x}"
        check(set(s) == seg_keys, f"{where}: keys {sorted(s)}")
        check(s["segment_type"] in ("large", "small"), f"{where}: segment_type {s['segment_type']}")
        check(isinstance(s["segment_pool_id"], tuple) and len(s["segment_pool_id"]) == 2, f"{where}: pool id")
        frames_ok(s["frames"], where)
        at, alloc, active, req, blocks = s["address"], 0, 0, 0, {}
        for b in s["blocks"]:
            check(set(b) == {"address", "size", "requested_size", "state", "frames"}, f"{where}: block keys")
            check(b["address"] == at, f"{where}: block at {b['address']:#x}, expected {at:#x} (blocks must tile)")
            check(b["state"] in ("active_allocated", "active_pending_free", "inactive"), f"{where}: state")
            check(b["size"] > 0 and 0 <= b["requested_size"] <= b["size"], f"{where}: block sizes")
            frames_ok(b["frames"], where)
            at += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
                req += b["requested_size"]
                blocks[b["address"]] = (b["size"], b["state"])
            if b["state"] == "active_allocated":
                alloc += b["size"]
        check(at == s["address"] + s["total_size"], f"{where}: blocks cover {at - s['address']} of {s['total_size']}")
        check(alloc == s["allocated_size"], f"{where}: allocated_size {s['allocated_size']} != blocks' {alloc}")
        check(active == s["active_size"], f"{where}: active_size")
        check(req == s["requested_size"], f"{where}: requested_size")
        final[at - s["total_size"]] = (s["device"], s["total_size"], blocks)

    # Forward replay of device_traces.
    actions = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
               "segment_unmap", "oom", "snapshot"}
    segs, blks = {}, {}
    n_entries = 0
    for dev, entries in enumerate(snap["device_traces"]):
        check(isinstance(entries, list), f"device_traces[{dev}] is not a list")
        for e in entries:
            n_entries += 1
            a = e.get("action")
            check(a in actions, f"trace action {a}")
            addr_key = "device_free" if a == "oom" else "addr"
            check(set(e) == {"action", addr_key, "size", "stream", "time_us", "frames"}, f"trace entry keys {sorted(e)}")
            frames_ok(e["frames"], f"trace entry {a}")
            addr, size = e.get(addr_key), e["size"]
            if "gpuheap_dropped_entries" in snap:
                continue  # history starts mid-way: checked backwards below
            if a == "segment_alloc":
                check(addr not in segs, f"segment_alloc {addr:#x} twice")
                segs[addr] = (dev, size)
            elif a == "segment_free":
                check(segs.pop(addr, None) == (dev, size), f"segment_free {addr:#x} of no such segment")
            elif a == "alloc":
                check(addr not in blks, f"alloc {addr:#x} twice")
                blks[addr] = (size, "active_allocated")
            elif a == "free_requested":
                check(blks.get(addr, (0, ""))[1] == "active_allocated", f"free_requested {addr:#x} not allocated")
                blks[addr] = (size, "active_pending_free")
            elif a == "free_completed":
                check(blks.pop(addr, (0, ""))[1] == "active_pending_free", f"free_completed {addr:#x} not pending")
    in_segs = {a: v for s in final.values() for a, v in s[2].items()}
    dropped = snap.get("gpuheap_dropped_entries")
    if dropped is None:
        check({a: v for a, v in segs.items()} == {a: (d, s) for a, (d, s, _) in final.items()},
              "segments replayed from device_traces differ from the final segments")
        check(blks == in_segs, f"blocks replayed from device_traces ({len(blks)}) differ from the final ones ({len(in_segs)})")
    else:
        # --max-entries dropped the oldest entries: history starts mid-way, so only the
        # viewer's own direction holds: backwards from the final state, every entry undoes.
        check(isinstance(dropped, list) and len(dropped) == len(snap["device_traces"]) and sum(dropped) > 0,
              f"gpuheap_dropped_entries {dropped}")
        check_backwards(snap, final, in_segs)

    # Independent replay of the recorded events (CSV).
    csegs, cblks, own = {}, {}, set()
    for row in csv.DictReader(open(csv_path, newline="")):
        ev, kind, ptr, size = row["event"], row["kind"], int(row["ptr"], 16), int(row["size"])
        if ev == "segment_alloc":
            csegs[ptr] = size
        elif ev == "segment_free":
            csegs.pop(ptr, None)
        elif ev == "alloc" and kind == "pooled":
            cblks[ptr] = (size, "active_allocated")
        elif ev == "alloc" and kind in ("device", "pitch", "async", "managed"):
            csegs[ptr] = size
            cblks[ptr] = (size, "active_allocated")
            own.add(ptr)
        elif ev == "free" and ptr in cblks and cblks[ptr][1] == "active_allocated" and not int(row["flags"]) & 4:
            if ptr in own:
                own.discard(ptr)
                del cblks[ptr]
                csegs.pop(ptr, None)
            else:
                cblks[ptr] = (cblks[ptr][0], "active_pending_free")
        elif ev == "free_completed" and ptr in cblks and cblks[ptr][1] == "active_pending_free":
            del cblks[ptr]
    check(csegs == {a: s for a, (_, s, _) in final.items()}, "final segments differ from the recorded events'")
    check(cblks == in_segs, "final blocks differ from the recorded events'")

    # Lists come in batches of at most 1000 (memory_viz's unpickler spreads a batch into
    # one call's arguments): at least one APPENDS per 1000 trace entries.
    appends = sum(1 for op, _, _ in pickletools.genops(raw) if op.name == "APPENDS")
    check(appends >= n_entries // 1000, f"{appends} APPENDS for {n_entries} entries: batches over 1000")
    if "segments" in want:
        check(len(final) == want["segments"], f"{len(final)} segments, expected {want['segments']}")
    if "blocks" in want:
        check(len(in_segs) == want["blocks"], f"{len(in_segs)} live blocks, expected {want['blocks']}")
    if errors:
        for e in errors[:20]:
            print("check_torch_snapshot: " + e)
        return 1
    print(f"check_torch_snapshot: ok: {len(final)} segments, {len(in_segs)} live blocks, {n_entries} trace entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
