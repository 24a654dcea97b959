# The official checkpoint formats in numpy (no torch float8 types, so that this runs on any
# torch): safetensors read/write, e4m3 / ue8m0 / e2m1 codecs, and the weight quantizers that
# store a trained float model exactly as tests/data/v4-tiny and v41-tiny are stored.
import json
import math
import struct

import numpy as np

# ---- scalar codecs ----

def _e4m3_table():
    """Values of the 256 e4m3fn codes (NaN for 0x7F / 0xFF)."""
    v = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v[b] = np.nan
            continue
        mag = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        v[b] = -mag if s else mag
    return v

E4M3 = _e4m3_table()
_POS = E4M3[:127]  # codes 0..126: the non-negative finite values, increasing
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def e4m3_encode(x):
    """Round to nearest e4m3 code, ties to the even code; |x| must be <= 448."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    assert np.all(a <= 448.0), "e4m3_encode: value out of range"
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = a - _POS[lo], _POS[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return np.where((x < 0) & (code != 0), code | 0x80, code).astype(np.uint8)


def e8m0_decode(b):
    return np.ldexp(1.0, b.astype(np.int64) - 127)


def pow2_scale(amax, qmax):
    """ue8m0 scale 2^ceil(log2(amax / qmax)) and its byte."""
    amax = np.maximum(amax, 1e-30)
    e = np.ceil(np.log2(amax / qmax)).astype(np.int64)
    assert e.min() >= -127 and e.max() <= 127
    return np.ldexp(1.0, e), (e + 127).astype(np.uint8)


def bf16_encode(x):
    """float -> bf16 bits, round to nearest even (x finite)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_decode(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# ---- weight quantizers (official layouts) ----

def quant_fp8_blocks(w, bo, bi):
    """[o, i] -> (e4m3 codes [o, i], ue8m0 bytes [ceil(o/bo), ceil(i/bi)], dequantized [o, i])."""
    o, i = w.shape
    so, si = math.ceil(o / bo), math.ceil(i / bi)
    pad = np.zeros((so * bo, si * bi))
    pad[:o, :i] = w
    amax = np.abs(pad).reshape(so, bo, si, bi).max(axis=(1, 3))
    s, sb = pow2_scale(amax, 448.0)
    full = np.repeat(np.repeat(s, bo, 0), bi, 1)[:o, :i]
    q = e4m3_encode(np.clip(w / full, -448, 448))
    return q, sb, E4M3[q] * full


def quant_fp4_rows(w, b=32):
    """[o, i] -> (packed I8 [o, i/2] low nibble first, ue8m0 [o, i/b], dequantized [o, i])."""
    o, i = w.shape
    v = w.reshape(o, i // b, b)
    s, sb = pow2_scale(np.abs(v).max(axis=2), 6.0)
    v = np.clip(v / s[..., None], -6, 6)
    code = np.abs(np.abs(v)[..., None] - FP4).argmin(axis=-1)  # nearest; ties to the lower code
    deq = (FP4[code] * np.where(v < 0, -1.0, 1.0) * s[..., None]).reshape(o, i)
    nib = (code | ((v < 0) & (code != 0)).astype(np.int64) << 3).reshape(o, i)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8).view(np.int8)
    return packed, sb, deq


def fp4_decode(packed, sbytes, b=32):
    p = packed.view(np.uint8).astype(np.int64)
    nib = np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[0], -1)
    v = FP4[nib & 7] * np.where(nib & 8, -1.0, 1.0)
    return v * np.repeat(e8m0_decode(sbytes), b, axis=1)


# ---- safetensors ----
_NP = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "I8": np.int8,
       "U8": np.uint8, "BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8}


def read_st(path):
    """{name: (dtype string, raw numpy array)}: codes stay codes (decode with decode())."""
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    hdr = json.loads(buf[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        arr = np.frombuffer(buf[8 + n + a:8 + n + b], dtype=_NP[v["dtype"]]).reshape(v["shape"])
        out[k] = (v["dtype"], arr)
    return out


def write_st(path, tensors, meta=None):
    """tensors: {name: (dtype string, numpy array of the storage type)}; names sorted."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, arr = tensors[name]
        b = np.ascontiguousarray(arr, dtype=_NP[dt]).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def dequantize(st, block):
    """Official tensors -> {name: float64 array} by the official formulas (model-spec §2.1).
    `block`: the dense FP8 weight block (128 V4, 32 V4.1). FP8 tables with [rows, cols/32]
    scales (Engram) and I8 experts use 1x32 blocks."""
    out = {}
    for k, (dt, a) in st.items():
        if k.endswith(".scale"):
            continue
        if dt == "F8_E4M3":
            sb = st[k[:-len(".weight")] + ".scale"][1]
            v = E4M3[a]
            if sb.shape[1] * 32 == a.shape[1] and sb.shape[0] == a.shape[0]:
                s = np.repeat(e8m0_decode(sb), 32, axis=1)
            else:
                s = np.repeat(np.repeat(e8m0_decode(sb), block, 0), block, 1)[:a.shape[0], :a.shape[1]]
            out[k] = v * s
        elif dt == "I8":
            out[k] = fp4_decode(a, st[k[:-len(".weight")] + ".scale"][1])
        elif dt == "BF16":
            out[k] = bf16_decode(a)
        else:
            out[k] = a.astype(np.float64) if dt in ("F32", "F64") else a.astype(np.int64)
    return out


def quantize_like(params, template, block):
    """Store float params with the names, dtypes and shapes of `template` (an existing
    fixture's header: {name: (dtype, array)}). Returns (tensors to write, dequantized params)."""
    out, deq = {}, {}
    for k, (dt, a) in template.items():
        if k.endswith(".scale"):
            continue
        w = np.asarray(params[k], dtype=np.float64)
        if dt == "F8_E4M3":
            sb = template[k[:-len(".weight")] + ".scale"][1]
            rows_x32 = sb.shape[0] == a.shape[0] and sb.shape[1] * 32 == a.shape[1]
            q, s, d = quant_fp8_blocks(w, 1, 32) if rows_x32 else quant_fp8_blocks(w, block, block)
            assert s.shape == sb.shape, (k, s.shape, sb.shape)
            out[k], out[k[:-len(".weight")] + ".scale"] = ("F8_E4M3", q), ("F8_E8M0", s)
        elif dt == "I8":
            q, s, d = quant_fp4_rows(w)
            out[k], out[k[:-len(".weight")] + ".scale"] = ("I8", q), ("F8_E8M0", s)
        elif dt == "BF16":
            q = bf16_encode(w)
            out[k], d = ("BF16", q), bf16_decode(q)
        elif dt == "F32":
            out[k], d = ("F32", w.astype(np.float32)), w.astype(np.float32).astype(np.float64)
        elif dt == "I64":
            out[k], d = ("I64", w.astype(np.int64)), w.astype(np.int64)
        else:
            raise ValueError(f"{k}: dtype {dt} not handled")
        assert out[k][1].shape == a.shape, (k, out[k][1].shape, a.shape)
        deq[k] = d
    return out, deq
