"""Allocates 8 GiB tensors until PyTorch fails, frees a few first so a cache exists to release,
and prints one JSON line naming the exception the program received."""
import json

import torch

held, err, kind = [], None, None
chunk = 8 << 30
try:
    for i in range(64):  # 512 GiB: well past any card
        held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        if i == 3:  # give some back: the allocators' caches now hold memory
            del held[:2]
except torch.OutOfMemoryError as e:
    kind, err = "torch.OutOfMemoryError", str(e)
except Exception as e:  # anything else is the wrong error for an out-of-memory condition
    kind, err = type(e).__module__ + "." + type(e).__name__, str(e)
print(json.dumps({"exception": kind, "message": (err or "")[:400], "held_chunks": len(held),
                  "held_gib": len(held) * 8}), flush=True)
