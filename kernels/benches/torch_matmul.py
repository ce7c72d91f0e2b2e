"""PyTorch's f32 linear throughput at the shapes of benches/dense_matmul.rs.

Run on the same machine as `cargo bench -p kiln-kernels --bench dense_matmul`,
with the same thread count (2 here):

    python kernels/benches/torch_matmul.py --threads 2

Prints GFLOP/s per shape for 1 and 64 rows (median of repeated timings).
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(576, 576), (576, 1536), (1536, 576), (576, 49152)]


def gflops(rows: int, k: int, n: int, repeats: int) -> float:
    x = torch.randn(rows, k)
    w = torch.randn(n, k)
    for _ in range(5):
        F.linear(x, w)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        F.linear(x, w)
        times.append(time.perf_counter() - start)
    return 2 * rows * k * n / statistics.median(times) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    for rows in (1, 64):
        for k, n in SHAPES:
            print(f"linear_f32 m{rows} {k}x{n}: {gflops(rows, k, n, args.repeats):.2f} GFLOP/s")


if __name__ == "__main__":
    main()
