"""C kernels for the in-process engine's decode step and weight loading on the CPU (`cpu_kernels.c`), called
through ctypes.

The source is compiled once per process, at first use, by the system C compiler (`$CC`, else `cc`, about
half a second) for the host CPU (`-march=native`). Where no compiler is found or the build fails, `load()`
returns None and the engine keeps torch's kernels (`cpu_kernels: auto`); docs/engines.md has the figures.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import shlex
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

    from asearch.engine.local.decoder import DecoderSpec

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
# Reassociation lets the dot products and sums vectorise, -fopenmp-simd glibc's vector expf; not -ffast-math,
# which assumes no inf/NaN and, linked in, flushes denormals process-wide.
COMPILE_FLAGS = (
    "-O3", "-march=native", "-fPIC", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
    "-fassociative-math", "-freciprocal-math", "-ffp-contract=fast",
)  # fmt: skip

_lock = threading.Lock()
_state: dict[str, ctypes.CDLL | None] = {}


def load() -> ctypes.CDLL | None:
    """The compiled kernels (built on the first call of the process), or None when they cannot be built."""
    with _lock:
        if "lib" not in _state:
            _state["lib"] = _build()
        return _state["lib"]


def _build() -> ctypes.CDLL | None:
    found = shutil.which("cc") or shutil.which("gcc")
    cc = shlex.split(os.environ["CC"]) if os.environ.get("CC") else [found] if found else None
    if cc is None:
        log.info("no C compiler found: the decode step uses torch's kernels")
        return None
    with tempfile.TemporaryDirectory(prefix="asearch-kernels-") as tmp:
        obj, lib_path = Path(tmp) / "cpu_kernels.o", Path(tmp) / "cpu_kernels.so"
        try:
            for cmd in (
                [*cc, *COMPILE_FLAGS, "-c", str(SOURCE), "-o", str(obj)],
                [*cc, "-shared", str(obj), "-o", str(lib_path), "-lm"],
            ):
                subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
            lib = ctypes.CDLL(str(lib_path))  # mapped: the file may go with the directory
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", "") or e
            log.warning(
                "building %s failed, the decode step uses torch's kernels: %s", SOURCE.name, detail
            )
            return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.decode_attention.argtypes = [ptr, i64, ptr, ptr, i64, i64, i64, i64, ptr, i64, i64, i64, i64, i64, ctypes.c_float, ptr]  # fmt: skip
    lib.sample_rows.argtypes = [ptr, i64, i64, ptr, ptr, ptr, ptr]
    lib.rms_norm.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_float, ptr]
    lib.rms_norm.restype = None
    lib.transpose_to_f32.argtypes = [ptr, i64, i64, i64, i64, ptr, i64]
    lib.transpose_to_f32.restype = None
    lib.decode_attention.restype = lib.sample_rows.restype = ctypes.c_int
    return lib


def kernels_for(setting: str, device: torch.device, dtype: torch.dtype) -> CpuKernels | None:
    """The engine's `cpu_kernels` resolved: the C kernels (CPU and float32, unless `torch`), or None."""
    import torch

    if setting == "torch" or device.type != "cpu" or dtype != torch.float32:
        return None
    lib = load()
    if lib is None:
        if setting == "native":
            raise ConfigError("cpu_kernels=native: the C kernels could not be built (see the log); use auto or torch")
        return None
    return CpuKernels(lib)


class CpuKernels:
    """The decode step's C kernels, float32 on the CPU. Same results as torch's path up to float32 rounding
    (other summation orders)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    def decode_attention(self, spec: DecoderSpec) -> DecodeAttention:
        return DecodeAttention(self.lib, spec.heads, spec.kv_heads, spec.head_dim)

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """RMSNorm of the rows of x (N, H) float32 with H contiguous (`F.rms_norm(x, (H,), weight, eps)`)."""
        import torch

        N, H = x.shape
        if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.stride(1) != 1 or weight.shape != (H,) or weight.stride(0) != 1:
            raise ValueError("rms_norm needs float32 rows with contiguous features and a contiguous weight")
        out = torch.empty(N, H, dtype=torch.float32)
        self.lib.rms_norm(x.data_ptr(), N, H, x.stride(0), weight.data_ptr(), eps, out.data_ptr())
        return out

    def sample(self, logits: Tensor, temperatures: list[float], uniforms: list[float]) -> tuple[list[int], list[float]]:
        """One token per row of logits (B, V) and its log-prob: row b at temperatures[b] (0: greedy) drawn
        by inverse CDF with uniforms[b] (`sampling.sample` without top-k / top-p)."""
        import torch

        B, V = logits.shape
        logits = logits.contiguous()
        temps = torch.tensor(temperatures, dtype=torch.float32)
        us = torch.tensor(uniforms, dtype=torch.float64)
        ids, lps = torch.empty(B, dtype=torch.long), torch.empty(B, dtype=torch.float32)
        if self.lib.sample_rows(logits.data_ptr(), B, V, temps.data_ptr(), us.data_ptr(), ids.data_ptr(), lps.data_ptr()):
            raise MemoryError("sample_rows could not allocate its scratch")
        return ids.tolist(), lps.tolist()

    def transpose_into(self, dst: Tensor, src: Tensor) -> bool:
        """dst (C, R) float32 = src (R, C) float32 or bfloat16, transposed (`dst.copy_(src.t())`; bit-exact);
        both on the CPU with contiguous rows, any row stride (dst may be a column slice of a fused matrix).
        False, writing nothing, for other dtypes, devices or layouts (the caller copies with torch)."""
        import torch

        if (
            dst.dtype != torch.float32 or src.dtype not in (torch.float32, torch.bfloat16) or dst.device.type != "cpu"
            or src.device.type != "cpu" or src.dim() != 2 or dst.shape != src.shape[::-1] or src.stride(1) != 1
            or dst.stride(1) != 1 or 0 in src.shape
        ):  # fmt: skip
            return False
        rows, cols = src.shape
        bf16 = int(src.dtype == torch.bfloat16)
        self.lib.transpose_to_f32(src.data_ptr(), bf16, rows, cols, src.stride(0), dst.data_ptr(), dst.stride(0))
        return True


class DecodeAttention:
    """RoPE, K/V write and attention of one new token per row over a `SlotKVCache` layer (`decoder.forward`'s
    `decode_attention`)."""

    def __init__(self, lib: ctypes.CDLL, heads: int, kv_heads: int, head_dim: int):
        self.lib, self.heads, self.kv_heads, self.head_dim = lib, heads, kv_heads, head_dim
        self.scale = 1.0 / math.sqrt(head_dim)

    def __call__(self, qkv: Tensor, rope: Tensor, kv: Tensor, positions: Tensor) -> Tensor:
        """qkv: (B, (heads + 2 kv_heads) * head_dim) rows of q | k | v heads, before RoPE; rope: (length, 2,
        head_dim) cos | signed sin (`RoPE.table`); kv: (B, 2, kv_heads, length, head_dim), the rows' slots of
        one layer's cache; positions: (B,) int64, where each row's token goes. Writes each row's rotated key
        and its value at its position, then attends positions 0 .. that one. Returns (B, heads * head_dim)."""
        import torch

        B = qkv.shape[0]
        width = (self.heads + 2 * self.kv_heads) * self.head_dim
        if (
            any(t.dtype != torch.float32 for t in (qkv, rope, kv)) or positions.dtype != torch.int64
            or qkv.shape[1] != width or qkv.stride(1) != 1 or not rope.is_contiguous() or kv.stride(4) != 1
            or kv.shape[0] != B or kv.shape[1:3] != (2, self.kv_heads) or kv.shape[4] != self.head_dim
            or rope.shape[1:] != (2, self.head_dim) or positions.shape != (B,)
        ):  # fmt: skip
            raise ValueError("DecodeAttention: tensors of the wrong dtype, shape or layout")
        positions = positions.contiguous()
        out = torch.empty(B, self.heads * self.head_dim, dtype=torch.float32)
        s_slot, s_kv, s_head, s_pos, _ = kv.stride()
        status = self.lib.decode_attention(
            qkv.data_ptr(), qkv.stride(0), rope.data_ptr(), kv.data_ptr(), s_slot, s_kv, s_head, s_pos,
            positions.data_ptr(), B, min(kv.shape[3], rope.shape[0]), self.kv_heads, self.heads // self.kv_heads,
            self.head_dim, self.scale, out.data_ptr(),
        )  # fmt: skip
        if status == -2:
            raise IndexError(f"a position past the KV cache ({kv.shape[3]}) or RoPE table ({rope.shape[0]})")
        if status != 0:
            raise MemoryError("decode_attention could not allocate its scores")
        return out
