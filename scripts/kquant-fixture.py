#!/usr/bin/env python3
"""Writes import/testdata/kquant_gguf_py.txt: random Q4_K, Q5_K and Q6_K blocks and their
values as dequantized by llama.cpp's own gguf-py (an outside reference for
import/src/gguf/kquant.rs, whose unit test reads the file).

Usage: GGUF_PY=~/.cache/llamacpp-0.3.36/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py \
       python3 scripts/kquant-fixture.py   (needs numpy)

Line format: `TYPE <block bytes, hex> <256 f32 values, each as 8 hex digits of its bits>`.
"""
import os
import random
import struct
import sys

sys.path.insert(0, os.path.expanduser(os.environ["GGUF_PY"]))
import numpy as np  # noqa: E402
from gguf.constants import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

rng = random.Random(16)
# (type, block bytes, byte offsets of f16 scales to keep finite)
TYPES = [(T.Q4_K, 144, [0, 2]), (T.Q5_K, 176, [0, 2]), (T.Q6_K, 210, [208])]
out = os.path.join(os.path.dirname(__file__), "..", "import", "testdata", "kquant_gguf_py.txt")
with open(out, "w") as f:
    for ty, size, scales in TYPES:
        for _ in range(3):
            blk = bytearray(rng.getrandbits(8) for _ in range(size))
            for at in scales:
                blk[at:at + 2] = np.float16(rng.uniform(-0.05, 0.05)).tobytes()
            values = dequantize(np.frombuffer(bytes(blk), dtype=np.uint8), ty).astype(np.float32)
            bits = "".join("%08x" % struct.unpack("<I", struct.pack("<f", v))[0] for v in values)
            f.write(f"{ty.name} {blk.hex()} {bits}\n")
print("wrote", out)
