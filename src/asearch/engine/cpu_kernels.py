"""C kernels for the in-process engine's decode step on the CPU (`cpu_kernels.c`), called through ctypes.

The source is compiled once per process, at first use, by the system C compiler (`$CC`, else `cc`, about
half a second) for the host CPU (`-march=native`). Where no compiler is found or the build fails, `load()`
returns None and the engine keeps torch's kernels (`cpu_attention: auto`); docs/engines.md has the figures.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from asearch.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from asearch.engine.decoder import DecoderSpec

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
# -ffast-math vectorises the dot products, sums and expf (glibc's vector expf); it is given to the compile
# step only: linked with it, the library would pull in crtfastmath.o, which flushes denormals process-wide.
COMPILE_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fPIC")

_lock = threading.Lock()
_state: dict[str, ctypes.CDLL | None] = {}


def load() -> ctypes.CDLL | None:
    """The compiled kernels (built on the first call of the process), or None when they cannot be built."""
    with _lock:
        if "lib" not in _state:
            _state["lib"] = _build()
        return _state["lib"]


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("no C compiler found: the decode step uses torch's attention kernel")
        return None
    with tempfile.TemporaryDirectory(prefix="asearch-kernels-") as tmp:
        obj, lib_path = Path(tmp) / "cpu_kernels.o", Path(tmp) / "cpu_kernels.so"
        try:
            for cmd in (
                [cc, *COMPILE_FLAGS, "-c", str(SOURCE), "-o", str(obj)],
                [cc, "-shared", str(obj), "-o", str(lib_path), "-lm"],
            ):
                subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
            lib = ctypes.CDLL(str(lib_path))  # mapped: the file may go with the directory
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", "") or e
            log.warning(
                "building %s failed, the decode step uses torch's attention kernel: %s", SOURCE.name, detail
            )
            return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.decode_attention.argtypes = [ptr, i64, ptr, i64, i64, i64, i64, ptr, i64, i64, i64, i64, ctypes.c_float, ptr]  # fmt: skip
    lib.decode_attention.restype = ctypes.c_int
    return lib


def decode_attention_for(
    setting: str, spec: DecoderSpec, device: torch.device, dtype: torch.dtype
) -> DecodeAttention | None:
    """The engine's `cpu_attention` resolved: the C kernel (CPU and float32, unless `sdpa`), or None for torch's."""
    import torch

    if setting == "sdpa" or device.type != "cpu" or dtype != torch.float32:
        return None
    lib = load()
    if lib is None:
        if setting == "native":
            raise ConfigError(
                "cpu_attention=native: the C decode kernel could not be built (see the log); use auto or sdpa"
            )
        return None
    return DecodeAttention(lib, spec.heads, spec.kv_heads, spec.head_dim)


class DecodeAttention:
    """Attention of one new token per row over a `SlotKVCache` layer, float32 on the CPU (`cpu_kernels.c`).

    Same result as the decode branch of `decoder.forward` up to float32 rounding (another summation order).
    """

    def __init__(self, lib: ctypes.CDLL, heads: int, kv_heads: int, head_dim: int):
        self.lib, self.heads, self.kv_heads, self.head_dim = lib, heads, kv_heads, head_dim
        self.scale = 1.0 / math.sqrt(head_dim)

    def __call__(self, qkv: Tensor, kv: Tensor, last: Tensor) -> Tensor:
        """qkv: (B, >= heads * head_dim) rows whose first heads * head_dim values are the query heads;
        kv: (B, 2, kv_heads, length, head_dim), the rows' slots of one layer's cache; last: (B,) int64,
        the last position each row attends. Returns (B, heads * head_dim)."""
        import torch

        B = qkv.shape[0]
        if qkv.dtype != torch.float32 or kv.dtype != torch.float32 or qkv.stride(1) != 1 or kv.stride(4) != 1:
            raise ValueError("DecodeAttention needs float32 rows and a cache with contiguous head_dim")
        last = last.contiguous()
        out = torch.empty(B, self.heads * self.head_dim, dtype=torch.float32)
        s_slot, s_kv, s_head, s_pos, _ = kv.stride()
        status = self.lib.decode_attention(
            qkv.data_ptr(), qkv.stride(0), kv.data_ptr(), s_slot, s_kv, s_head, s_pos, last.data_ptr(),
            B, self.kv_heads, self.heads // self.kv_heads, self.head_dim, self.scale, out.data_ptr(),
        )  # fmt: skip
        if status != 0:
            raise MemoryError("decode_attention could not allocate its scores")
        return out
