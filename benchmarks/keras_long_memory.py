"""Peak memory of Keras attention forward on TensorFlow at long lengths (B=1, H=8, D=64, causal): our dispatch
(key-blocked online softmax) against our explicit path, which materialises every score as Keras' own layer does.
Each measurement runs in a fresh process and reports peak RSS growth over the process's baseline.

    .venv/bin/python benchmarks/keras_long_memory.py
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import os, resource, sys, json
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, keras
from multihead.keras import attention
from multihead.keras.functional import _explicit
path, length = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
q, k, v = (keras.ops.convert_to_tensor(rng.normal(size=(1, 8, length, 64)).astype("float32")) for _ in range(3))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if path == "ours":
    out = attention(q, k, v, causal=True)
else:
    out = _explicit(q, k, v, None, True, None, 0.0, None)[0]
float(keras.ops.sum(out))
print(json.dumps({"path": path, "length": length,
                  "peak_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024}))
"""


def main() -> None:
    for length in (2048, 4096, 8192, 16384):
        for path in ("ours", "explicit"):
            if path == "explicit" and length > 8192:
                continue  # 8 GiB of float32 scores alone
            result = subprocess.run([sys.executable, "-c", CHILD, path, str(length)], capture_output=True, text=True)
            row = json.loads(result.stdout.strip().splitlines()[-1])
            print(f"L={length:6d}  {path:9s} peak +{row['peak_mib']:8.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
