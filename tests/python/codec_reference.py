#!/usr/bin/env python3
"""An independent reference of the PolyKV value and key codec, from its written definition
(kernels/include/polykv/kernels/codec.h and codec_math.h comments, TurboQuant-MSE of Zandieh
et al. 2025), in plain Python double precision: no code shared with the C++ implementation,
which runs the butterfly in float32 with one combined scale.

Values: norm = ||v||; u = v / norm; y = H D u, with D the random signs (D_i = -1 when the top
bit of splitmix64-mix(seed + (i + 1) * 0x9E3779B97F4A7C15) is set) and H the block-diagonal
orthonormal Walsh-Hadamard matrix (Sylvester order, blocks of the largest power of two that
divides head_dim); z = sqrt(head_dim) * y; code_i = the nearest Lloyd-Max level of N(0, 1)
(ties to the lower level); codes packed LSB-first (code i in stream bits [i*b, (i+1)*b), stream
bit k = bit k % 8 of byte k / 8). Stored norm: ||v||, or with norm correction
||v|| / ||u_hat|| where ||u_hat|| = sqrt(sum levels[code]^2 / head_dim).
Keys (per tensor): scale = absmax / 127, q = round-half-even(x / scale).

Usage: codec_reference.py GOLDEN_JSON   checks every case of the file (the golden bytes the
C++ test CodecGolden asserts) against this reference and exits non-zero naming a mismatch.
       codec_reference.py --print       prints the cases as this reference computes them.
"""
import json
import math
import sys

MASK = (1 << 64) - 1
GOLDEN_RATIO = 0x9E3779B97F4A7C15
DEFAULT_SEED = 0x9E3779B97F4A7C15


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def sign(seed, i):
    return -1.0 if mix64((seed + (i + 1) * GOLDEN_RATIO) & MASK) >> 63 else 1.0


def lloyd_max(bits):
    """Levels of the optimal scalar quantizer of N(0, 1): fixed point of (thresholds at
    midpoints, levels at the conditional means of their cells)."""
    n = 1 << bits
    pdf = lambda x: math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    # P(a < X < b) from the upper tail Q(x) = erfc(x / sqrt 2) / 2 (precise in both tails
    # for a symmetric pair).
    q = lambda x: 0.5 * math.erfc(x / math.sqrt(2))
    levels = [-2.0 + 4.0 * i / (n - 1) for i in range(n)] if n > 1 else [0.0]
    for _ in range(200000):
        t = [-math.inf] + [(levels[i] + levels[i + 1]) / 2 for i in range(n - 1)] + [math.inf]
        new = []
        for i in range(n):
            a, b = t[i], t[i + 1]
            pa = 0.0 if math.isinf(a) else pdf(a)
            pb = 0.0 if math.isinf(b) else pdf(b)
            mass = q(a) - q(b)
            new.append((pa - pb) / mass)
        moved = max(abs(x - y) for x, y in zip(new, levels))
        levels = new
        if moved < 1e-15:
            break
    return levels


def hadamard_block(d):
    return d & -d


def rotate(u, seed):
    """y = H D u with H block-diagonal orthonormal Sylvester-Hadamard."""
    d = len(u)
    block = hadamard_block(d)
    du = [u[i] * sign(seed, i) for i in range(d)]
    y = [0.0] * d
    for off in range(0, d, block):
        for r in range(block):
            acc = 0.0
            for c in range(block):
                h = -1.0 if bin(r & c).count("1") % 2 else 1.0
                acc += h * du[off + c]
            y[off + r] = acc / math.sqrt(block)
    return y


def pack(codes, bits):
    nbytes = (len(codes) * bits + 7) // 8
    out = bytearray(nbytes)
    for i, c in enumerate(codes):
        for k in range(bits):
            if (c >> k) & 1:
                pos = i * bits + k
                out[pos // 8] |= 1 << (pos % 8)
    return bytes(out)


def encode_value(v, bits, seed, norm_correction):
    """Returns (packed bytes, stored norm, smallest |z - threshold| seen)."""
    d = len(v)
    levels = lloyd_max(bits)
    thresholds = [(levels[i] + levels[i + 1]) / 2 for i in range(len(levels) - 1)]
    norm = math.sqrt(sum(x * x for x in v))
    y = rotate([x / norm for x in v], seed)
    z = [math.sqrt(d) * yi for yi in y]
    codes = [sum(1 for t in thresholds if zi > t) for zi in z]
    margin = min(abs(zi - t) for zi in z for t in thresholds)
    stored = norm
    if norm_correction:
        stored = norm / math.sqrt(sum(levels[c] ** 2 for c in codes) / d)
    return pack(codes, bits), stored, margin


def quantize_keys_per_tensor(k):
    absmax = max(abs(x) for x in k)
    scale = absmax / 127.0
    return [int(round(x / scale)) for x in k], scale  # Python's round: half to even


def golden_input(vectors, d):
    """The C++ test's input: v[j][i] = sin(0.37 i + 1.3 j) + 0.25 cos(2.1 i j), rounded to
    float32 as the test stores it."""
    import struct
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
    return [[f32(math.sin(0.37 * i + 1.3 * j) + 0.25 * math.cos(2.1 * i * j)) for i in range(d)]
            for j in range(vectors)]


def compute(case):
    vectors = golden_input(case["vectors"], case["head_dim"])
    seed = int(case["seed"], 16)
    out = []
    for v in vectors:
        packed, norm, margin = encode_value(v, case["bits"], seed, case["norm_correction"])
        out.append((packed.hex(), norm, margin))
    return out


def main(argv):
    if len(argv) == 2 and argv[1] == "--print":
        for bits, d, n, seed, nc in [(3, 64, 2, DEFAULT_SEED, False), (4, 48, 1, 12345, True)]:
            case = {"bits": bits, "head_dim": d, "vectors": n, "seed": hex(seed),
                    "norm_correction": nc}
            print(case, compute(case))
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        golden = json.load(f)
    failures = 0
    # Lloyd-Max levels of the published tables (Max 1960), as the C++ test pins them too.
    lm3 = lloyd_max(3)
    for got, want in zip(lm3[4:], [0.2451, 0.7560, 1.3439, 2.1520]):
        if abs(got - want) > 5e-4:
            print(f"FAIL lloyd-max 3 bits: level {got} vs Max's table {want}")
            failures += 1
    for case in golden["value_cases"]:
        for j, (hexes, norm, margin) in enumerate(compute(case)):
            want_hex = case["packed_hex"][j]
            want_norm = case["norms"][j]
            # Codes are exact when no coordinate lies within float32 rounding of a threshold.
            if margin < 1e-4:
                print(f"FAIL {case['name']}[{j}]: a coordinate is {margin:.2e} from a threshold; "
                      "choose an input the reference decides without doubt")
                failures += 1
            if hexes != want_hex:
                print(f"FAIL {case['name']}[{j}]: packed\n  reference {hexes}\n  golden    {want_hex}")
                failures += 1
            if abs(norm - want_norm) > 2e-6 * abs(norm):
                print(f"FAIL {case['name']}[{j}]: norm reference {norm!r} golden {want_norm!r}")
                failures += 1
            print(f"ok {case['name']}[{j}]: {hexes} norm {norm:.7f} (golden {want_norm}), "
                  f"margin to the nearest threshold {margin:.3g}")
    for case in golden["key_cases"]:
        k = [float(x) for x in case["input"]]
        q, scale = quantize_keys_per_tensor(k)
        if q != case["codes"] or abs(scale - case["scale"]) > 1e-7 * scale:
            print(f"FAIL {case['name']}: reference codes {q} scale {scale}")
            failures += 1
        else:
            print(f"ok {case['name']}: {len(q)} codes, scale {scale:.9g}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
