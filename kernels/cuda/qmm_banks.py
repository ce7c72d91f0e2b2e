#!/usr/bin/env python3
"""Shared-memory wavefronts of qmatmul.cu's decoding, without a GPU.

Each block of `kiln_qmm_*` decodes its 64 W rows' stretch of 128 columns
into a shared tile (rows KILN_QMM_STRIDE = 136 bf16 apart) before the
tensor-core products read it. This counts the wavefronts (passes of the
shared memory's 32 four-byte banks) of one warp's decoding stores a
stretch, format by format, for the lane order a thread's part and row came
in before (a row's parts on consecutive lanes, runs of 4 values stored 8
bytes at a time) and now (K-quants: rows on consecutive lanes; runs of 8
stored 16 bytes at a time), against the ideal (the bytes stored / 128);
then, for Q4_K, a warp's whole shared traffic a stretch (with the
fragments' ldmatrix loads, the 64-row kernel's warps before and after their
2 x 2 layout, and x's copies) and what it asks of an SM's shared memory.

The bank model: a warp's 8-byte accesses go in two half-warp phases, its
16-byte accesses in four quarter-warp phases; a phase takes as many
wavefronts as the most distinct words any one bank is asked for.

    kernels/cuda/qmm_banks.py
"""

STRIDE_WORDS = 136 * 2 // 4  # a tile row, in 4-byte words
THREADS, TILE = 128, 64


def wavefronts(accesses, width):
    """Wavefronts of one warp instruction: (lane, byte address) each of width bytes."""
    lanes_per_phase = {4: 32, 8: 16, 16: 8}[width]
    total = 0
    for phase in range(0, 32, lanes_per_phase):
        words = {}
        for lane, address in accesses:
            if phase <= lane < phase + lanes_per_phase:
                for w in range(address // 4, (address + width) // 4):
                    words.setdefault(w % 32, set()).add(w)
        total += max(len(v) for v in words.values())
    return total


def thread_part(t, parts, rows_fastest):
    """Stretch<F>::part_of_thread and row_of_thread."""
    if rows_fastest:
        warp_rows = 32 // parts
        return t % 32 // warp_rows, t // 32 * warp_rows + t % warp_rows
    return t % parts, t // parts


# Each format: (PARTS, the runs a part stores as (column, values) for runs
# of 4 and for runs of 8, from the part's lane index in its block).
def k_quant(lane, run):  # Q4_K, Q5_K: sub-blocks 2c (lo) and 2c + 1 (hi)
    first = 64 * (lane // 2) + 16 * (lane % 2)
    return [(first + 32 * hi + 4 * w, run) for w in range(0, 4, run // 4) for hi in range(2)]


def q6_k(lane, run):  # quarters e and e + 2
    first = 32 * (lane // 2) + 16 * (lane % 2)
    return [(first + 64 * g + 4 * w, run) for g in range(2) for w in range(0, 4, run // 4)]


def q8_0(part, run):  # 8 quants a part: one run of 8 or two of 4
    block, lane = part // 4, part % 4
    return [(32 * block + 8 * lane + e, run) for e in range(0, 8, run)]


def q4_0(part, run):  # 4 low and 4 high nibbles: runs of 4 only
    block, lane = part // 4, part % 4
    return [(32 * block + 16 * h + 4 * lane, 4) for h in range(2)]


FORMATS = {"Q4_K/Q5_K": (4, k_quant), "Q6_K": (4, q6_k), "Q8_0": (16, q8_0), "Q4_0/Q5_0": (16, q4_0)}


def warp_wavefronts(parts, runs_of, run, rows_fastest, warp=0):
    per_thread = []
    for lane in range(32):
        part, row = thread_part(warp * 32 + lane, parts, rows_fastest)
        row_step = THREADS // parts
        stores = [
            (row + j * row_step, column, n)
            for j in range(TILE * parts // THREADS)
            for column, n in runs_of(part, run)
        ]
        per_thread.append(stores)
    total = 0
    for slot in range(len(per_thread[0])):
        width = per_thread[0][slot][2] * 2
        accesses = [(lane, r * STRIDE_WORDS * 4 + c * 2) for lane, (r, c, _) in enumerate(s[slot] for s in per_thread)]
        total += wavefronts(accesses, width)
    ideal = sum(n * 2 for _, _, n in per_thread[0]) * 32 // 128
    return total, ideal


def fragment_loads(x_groups, w_sub, x_sub):
    """A warp's ldmatrix .x4 loads a stretch (8 chunks of 16 columns), 4
    wavefronts each (padded rows: conflict-free): its w_sub groups of 16 W
    rows' fragments and x_sub groups of x's."""
    return 8 * (w_sub + x_sub) * 4


if __name__ == "__main__":
    print("shared wavefronts of one warp's decoding stores a stretch (ideal: bytes / 128)")
    print(f"{'format':<10} {'before':>7} {'now':>5} {'ideal':>6}")
    for name, (parts, runs_of) in FORMATS.items():
        before, ideal = warp_wavefronts(parts, runs_of, 4, False)
        run_now = 4 if runs_of is q4_0 else 8
        now, _ = warp_wavefronts(parts, runs_of, run_now, parts <= 4)
        print(f"{name:<10} {before:>7} {now:>5} {ideal:>6}")
    print()
    print("Q4_K: a warp's shared wavefronts a stretch (decoding + fragments + x's copies),")
    print("and an SM's shared cycles a stretch at its resident warps (one wavefront a cycle)")
    stores_before = warp_wavefronts(4, k_quant, 4, False)[0]
    stores_now = warp_wavefronts(4, k_quant, 8, True)[0]
    for kernel, warps, x_groups, before, now in [
        ("_m16", 20, 1, (1, 1), (1, 1)),
        ("64-row", 16, 4, (1, 4), (2, 2)),
    ]:
        copies = 16 * x_groups * 128 * 2 // 128 // 4  # x's 16-byte copies, conflict-free
        old = stores_before + fragment_loads(x_groups, *before) + copies
        new = stores_now + fragment_loads(x_groups, *now) + copies
        print(f"{kernel:<7} {old} -> {new} a warp; {old * warps} -> {new * warps} cycles an SM ({warps} warps)")
