"""Numpy-only safetensors reader/writer plus the exact weight encodings the fixtures use (BF16, MXFP4).

No torch and no `safetensors` package needed, so the fixture builder and the NumPy reference run with Debian's
python3-numpy.  The encodings are bit-exact: what `write_safetensors` stores is what `read_safetensors` and the
C engine decode."""
import json
import struct

import numpy as np

# E2M1 code -> value; codes 8..15 are the negatives (8 = -0).
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)

_NP_OF = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "U8": np.uint8, "I8": np.int8,
          "I32": np.int32, "I64": np.int64}


def read_safetensors(path, raw_bf16=False):
    """name -> array.  BF16 tensors are widened exactly to float32 (or returned as uint16 bits if raw_bf16)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[8 + n + a:8 + n + b]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(buf, "<u2")
            arr = bits.copy() if raw_bf16 else (bits.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(buf, np.dtype(_NP_OF[info["dtype"]]).newbyteorder("<")).copy()
        out[name] = arr.reshape(info["shape"])
    return out


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


class BF16:
    """Marks a uint16 array of bfloat16 bit patterns for write_safetensors."""

    def __init__(self, bits):
        self.bits = np.ascontiguousarray(bits, dtype="<u2")
        self.shape = self.bits.shape


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> np.ndarray (float32/uint8/...) or BF16.  Names are written sorted, 8-byte aligned."""
    header, blobs, off = {}, [], 0
    rev = {np.dtype(v): k for k, v in _NP_OF.items()}
    for name in sorted(tensors):
        t = tensors[name]
        if isinstance(t, BF16):
            dt, data = "BF16", t.bits.tobytes()
        else:
            a = np.ascontiguousarray(t)
            dt = rev[a.dtype]
            data = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if metadata:
        header["__metadata__"] = metadata
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def bf16_bits(x):
    """float -> bfloat16 bit patterns, round to nearest even (via float32, as torch's .to(bfloat16))."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def mxfp4_dequant(packed, scale):
    """packed u8 [out, in/2] (low nibble = even column), scale u8 [out, in/32] E8M0 -> float64 [out, in]."""
    assert packed.shape[1] == scale.shape[1] * 16, (packed.shape, scale.shape)
    vals = np.stack([E2M1[packed & 15], E2M1[packed >> 4]], -1).reshape(packed.shape[0], -1)
    return vals * np.repeat(np.exp2(scale.astype(np.float64) - 127.0), 32, axis=1)


def mxfp4_quant(w):
    """float [out, in] -> (packed u8 [out, in/2], scale u8 [out, in/32]).

    Per block of 32 along `in`: the smallest power-of-two scale 2^e with max|w|/2^e <= 6 (so nothing clips),
    then each element goes to the nearest E2M1 value (ties to the smaller magnitude)."""
    w = np.asarray(w, dtype=np.float64)
    o, i = w.shape
    assert i % 32 == 0
    blk = w.reshape(o, i // 32, 32)
    amax = np.abs(blk).max(-1)
    e = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)).astype(np.int64)
    e = np.clip(e, -126, 126)
    scaled = blk / np.exp2(e)[..., None]
    mags = E2M1[:8]
    code = np.abs(np.abs(scaled)[..., None] - mags).argmin(-1)          # first (smaller) magnitude wins ties
    code = np.where((scaled < 0) & (code > 0), code + 8, code).astype(np.uint8).reshape(o, i)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8)
    scale = (e + 127).astype(np.uint8)
    assert scale.max() < 255
    return packed, scale
