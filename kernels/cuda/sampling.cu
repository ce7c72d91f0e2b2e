// Sampling on the device: one block per logits row picks the next token and
// the requested log-probabilities, so only ids and a few floats go back to
// the host.
//
// The order of operations is the host sampler's (engine/sampling.rs), so the
// same uniform draw picks the same token on either backend: log-probabilities
// of the raw row; a structured-output mask, penalties, the logit bias and
// banned tokens; greedy → the first maximum; else the finite logits divided
// by the temperature, sorted descending (ties by index), truncated to top_k,
// softmax over the survivors, min_p and top_p cuts, and the draw walked
// along the kept tokens (or, for a row with a draft, the draft kept when the
// draw falls below its probability, else the second draw walked along the
// others).
//
// Nothing is sorted: every "position in the sorted order" question is a
// prefix_select, which finds by bisection over the value's bits the element
// at which a prefix sum (of counts or probabilities) in sorted order reaches
// a target, then settles ties by index with a block scan.
//
// Every pass over the vocabulary goes through for_each_batched
// (kiln_cuda.cuh), eight loads a thread issued before the first is used,
// its second function consuming what the first loaded (a sum, a maximum, a
// store), and the tests of a pass take the values it loaded (`(i, v)`
// forms), not loads of their own. A loop unrolled by `#pragma unroll 8` does
// not keep loads in flight: NVRTC keeps each load behind the bound check
// before it, so sm_90's SASS of such a loop was load, use, branch, eight
// times over, a memory round trip an element: 250 in a row a pass at 512
// threads over a 128k vocabulary, and a top-p cut past the likeliest tokens
// makes ~20 passes (3.9 ms a step at batch 1 on the H200, 2026-12-04).
#include "kiln_cuda.cuh"

// Threads of a row's block (the host launches this many): a greedy pick is
// one pass over the vocabulary, so more threads are fewer memory round trips.
#define KILN_SAMPLE_THREADS 512

// Per row; mirrors `SampleParams` on the Rust side (all 4-byte fields).
struct KilnSampleParams {
  float temperature;   // 0: greedy
  float top_p;         // 1: off
  float min_p;         // 0: off
  float uniform;       // the draw in [0, 1)
  float repetition;    // 1: off
  float frequency;
  float presence;
  int top_k;           // 0: off
  int logprobs;        // -1: none; n ≥ 0: the chosen token's and the top n
  int adjust_begin;    // this row's entries in `adjust`
  int adjust_end;
  int mask;            // this row's allowed-token mask: its first word in
                       // `masks` (bit t % 32 of word t / 32), -1 for none
  int draft;           // a token proposed for the row (speculative
                       // decoding), -1 for none: a sampled row keeps it
                       // with its probability, else draws from the rest
  float again;         // that second draw, in [0, 1)
};

// A token the penalties, the logit bias or min_tokens touch.
struct KilnAdjust {
  int token;
  int generated;  // times generated so far
  int flags;      // 1: in the prompt or the output (repetition penalty);
                  // 2: suppressed (min_tokens: EOS and stop ids)
  float bias;     // added after the penalties (logit_bias)
};

// An element's weight in a selection (-1: not a member) and its sort key.
struct Weighed {
  float weight;
  unsigned int key;
};

// The element of `v` (restricted to `member(i, v[i])`) at which the prefix
// sum of `weight(i, v[i])` in sorted order (value descending, index
// ascending) first reaches `target`; -1 when the members' total falls short.
// A target ≤ 0 selects the first member. Every thread gets the result.
// `found` is two shared ints.
//
// Each element's weight in the selection (-1 for a non-member) is worked out
// once, into the row's `selected` scratch, and every later pass reads it
// there: the predicates and weights (an expf and a division an element for
// probabilities) cost a pass each, and a selection makes 19 of them. A
// thread reads back only the elements it wrote until the ties' scan, behind
// a barrier; the sums are those the predicates gave.
template <typename Member, typename Weight>
__device__ int prefix_select(const float* v, float* selected, int n, Member member, Weight weight, float target,
                             float* scratch, float* scan, int* found) {
  const bool first_member = !(target > 0.0f);
  if (first_member) target = 1.0f;
  float total = 0.0f;
  for_each_batched<float>(n, [&](int i) { return v[i]; }, [&](int i, float value) {
    const float weight_i = member(i, value) ? (first_member ? 1.0f : weight(i, value)) : -1.0f;
    selected[i] = weight_i;
    if (weight_i >= 0.0f) total += weight_i;
  });
  auto weighed = [&](int i) { return Weighed{selected[i], order_key(v[i])}; };
  total = block_sum(total, scratch);
  if (total < target) return -1;
  // The largest key K with Σ_{key ≥ K} weight ≥ target, two bits a pass:
  // the sums at K's next two bits 01, 10 and 11 in one pass, the same sums
  // (each thread's elements in the same order) that bisection bit by bit
  // would take in two, and as they only shrink as the key grows, the largest
  // digit reaching the target is the one bisection finds.
  unsigned int k = 0;
  for (int low = 30; low >= 0; low -= 2) {
    float sum[3] = {0.0f, 0.0f, 0.0f};
    for_each_batched<Weighed>(n, weighed, [&](int, Weighed e) {
      if (e.weight < 0.0f) return;
#pragma unroll
      for (unsigned int digit = 1; digit <= 3; ++digit)
        if (e.key >= (k | digit << low)) sum[digit - 1] += e.weight;
    });
    unsigned int reached = 0;
#pragma unroll
    for (unsigned int digit = 1; digit <= 3; ++digit)
      if (block_sum(sum[digit - 1], scratch) >= target) reached = digit;
    k |= reached << low;
  }
  // The mass strictly above K, then the ties at K in index order: each
  // thread scans a contiguous chunk after an exclusive scan of the chunks.
  float above = 0.0f;
  for_each_batched<Weighed>(n, weighed, [&](int, Weighed e) {
    if (e.weight >= 0.0f && e.key > k) above += e.weight;
  });
  above = block_sum(above, scratch);
  int chunk = (n + blockDim.x - 1) / blockDim.x;
  int begin = min(n, (int)threadIdx.x * chunk), end = min(n, begin + chunk);
  float mine = 0.0f;
  int last_tie = -1;
  __syncthreads();  // the chunks' elements, other threads' writes
  for_each_batched<Weighed>(begin, end, 1, weighed, [&](int i, Weighed e) {
    if (e.weight >= 0.0f && e.key == k) {
      mine += e.weight;
      last_tie = i;
    }
  });
  scan[threadIdx.x] = mine;
  if (threadIdx.x == 0) {
    found[0] = 0x7fffffff;
    found[1] = -1;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float running = 0.0f;
    for (int t = 0; t < (int)blockDim.x; ++t) {
      float here = scan[t];
      scan[t] = running;
      running += here;
    }
  }
  __syncthreads();
  float running = above + scan[threadIdx.x];
  bool crossed = false;
  for_each_batched<Weighed>(begin, end, 1, weighed, [&](int i, Weighed e) {
    if (crossed || e.weight < 0.0f || e.key != k) return;
    running += e.weight;
    if (running >= target) {
      atomicMin(&found[0], i);
      crossed = true;
    }
  });
  if (last_tie >= 0) atomicMax(&found[1], last_tie);
  __syncthreads();
  // Rounding can leave the crossing unfound: then the last tie.
  int result = found[0] != 0x7fffffff ? found[0] : found[1];
  __syncthreads();
  return result;
}

// The block's first element in sorted order from each thread's (`best`,
// `best_i`: its largest key and the lowest index holding it; `best_i`
// 0x7fffffff for none): the largest key, then the lowest index holding it.
// Every thread gets the index.
__device__ int block_first_largest(unsigned int best, int best_i, int* found) {
  if (threadIdx.x == 0) {
    found[0] = 0;
    found[1] = 0x7fffffff;
  }
  __syncthreads();
  if (best_i != 0x7fffffff) atomicMax(reinterpret_cast<unsigned int*>(&found[0]), best);
  __syncthreads();
  if (best_i != 0x7fffffff && best == (unsigned int)found[0]) atomicMin(&found[1], best_i);
  __syncthreads();
  int result = found[1];
  __syncthreads();
  return result;
}

// The first element i < n with member(i, key) in sorted order (the largest
// key, the lowest index among equal keys), every element's key that of
// `value(i)`, in one pass; 0x7fffffff for none. Every thread gets the result.
template <typename Value, typename Member>
__device__ int first_largest_of(int n, Value value, Member member, int* found) {
  unsigned int best = 0;
  int best_i = 0x7fffffff;
  for_each_batched<float>(n, value, [&](int i, float v) {
    unsigned int key = order_key(v);
    if (member(i, key) && (key > best || best_i == 0x7fffffff)) {  // strided: a later i never wins a tie
      best = key;
      best_i = i;
    }
  });
  return block_first_largest(best, best_i, found);
}

// first_largest_of every element: greedy's pick in one pass, where
// prefix_select takes 19.
template <typename Value>
__device__ int first_largest(int n, Value value, int* found) {
  return first_largest_of(n, value, [](int, unsigned int) { return true; }, found);
}

// first_largest of a row of `n` floats (NaN as -inf), the row 16-byte aligned
// and n a multiple of 4: read 16 bytes at a time, eight loads in flight per
// thread before the first is compared (greedy decode's pick over a 128k
// vocabulary took 99 µs on an H200 one float at a time). A thread's
// elements come in rising order, so its first largest is kept as above.
__device__ int first_largest_row(const float* x, int n, int* found) {
  const int depth = 8, quads = n / 4;
  unsigned int best = 0;
  int best_i = 0x7fffffff;
  for (int q0 = threadIdx.x; q0 < quads; q0 += depth * blockDim.x) {
    Bytes16 raw[depth];
#pragma unroll
    for (int u = 0; u < depth; ++u)
      if (q0 + u * (int)blockDim.x < quads) raw[u] = load_streaming(x + 4 * (i64)(q0 + u * (int)blockDim.x));
#pragma unroll
    for (int u = 0; u < depth; ++u) {
      int q = q0 + u * (int)blockDim.x;
      if (q >= quads) continue;
      for (int j = 0; j < 4; ++j) {
        float v = __uint_as_float(raw[u].v[j]);
        unsigned int key = order_key(v == v ? v : KILN_NEG_INF);
        if (key > best || best_i == 0x7fffffff) {
          best = key;
          best_i = 4 * q + j;
        }
      }
    }
  }
  return block_first_largest(best, best_i, found);
}

// True when element i, of key ki, comes no later than element b, of key
// kb, in sorted order.
__device__ __forceinline__ bool not_after_key(unsigned int ki, int i, unsigned int kb, int b) {
  return ki > kb || (ki == kb && i <= b);
}

// The first element of `v` after element `prev` in sorted order (the very
// first when prev < 0), in one pass.
__device__ int next_in_order(const float* v, int n, int prev, int* found) {
  const unsigned int prev_key = prev < 0 ? 0 : order_key(v[prev]);
  return first_largest_of(
      n, [&](int i) { return v[i]; },
      [&](int i, unsigned int key) { return prev < 0 || !not_after_key(key, i, prev_key, prev); }, found);
}

__device__ __forceinline__ bool finite(float x) { return x == x && fabsf(x) <= 3.402823466e38f; }

// A sampled row's likeliest tokens, sorted in shared memory (key descending,
// index ascending: the order every selection here uses), with their
// probabilities. They are always a prefix of the row's sorted order, so a
// cut or a draw that lands among them is taken there by one thread walking
// them as the host sampler walks its sorted vector (the same sums in the
// same order), in a pass and a sort instead of prefix_select's 19 passes
// over the row a selection.
#define KILN_SAMPLE_CANDIDATES 2048
// Candidates are the tokens of probability at least 1 / KILN_SAMPLE_LIKELY
// under the softmax of every finite logit: at most that many (a few more by
// rounding), so they fit.
#define KILN_SAMPLE_LIKELY 1024.0f

struct SampleCandidates {
  unsigned int key[KILN_SAMPLE_CANDIDATES];
  int index[KILN_SAMPLE_CANDIDATES];
  float prob[KILN_SAMPLE_CANDIDATES];
  int count;  // gather_sorted's counter
};

// True when candidate a comes before candidate b in sorted order.
__device__ __forceinline__ bool sorts_before(const SampleCandidates& c, int a, int b) {
  return c.key[a] > c.key[b] || (c.key[a] == c.key[b] && c.index[a] < c.index[b]);
}

// Gathers the elements of `v` at or above `cut` into `c`, sorted (bitonic,
// over the next power of two, padded with entries that sort last); 0
// candidates when they do not fit. Returns the count.
__device__ int gather_sorted(const float* v, int n, float cut, SampleCandidates& c) {
  if (threadIdx.x == 0) c.count = 0;
  __syncthreads();
  for_each_batched<float>(n, [&](int i) { return v[i]; }, [&](int i, float value) {
    if (value >= cut) {
      int at = atomicAdd(&c.count, 1);
      if (at < KILN_SAMPLE_CANDIDATES) {
        c.key[at] = order_key(value);
        c.index[at] = i;
      }
    }
  });
  __syncthreads();
  int count = c.count;
  __syncthreads();
  if (count > KILN_SAMPLE_CANDIDATES) count = 0;
  int size = 1;
  while (size < count) size <<= 1;
  for (int i = count + threadIdx.x; i < size; i += blockDim.x) {
    c.key[i] = 0;
    c.index[i] = 0x7fffffff;
  }
  __syncthreads();
  for (int span = 2; span <= size; span <<= 1)
    for (int stride = span / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        int l = i ^ stride;
        if (l > i && ((i & span) == 0 ? sorts_before(c, l, i) : sorts_before(c, i, l))) {
          unsigned int key = c.key[i];
          int index = c.index[i];
          c.key[i] = c.key[l];
          c.index[i] = c.index[l];
          c.key[l] = key;
          c.index[l] = index;
        }
      }
      __syncthreads();
    }
  return count;
}

// Thread 0's `v`, for every thread (through the shared int `slot`).
__device__ __forceinline__ int from_thread0(int v, int* slot) {
  if (threadIdx.x == 0) *slot = v;
  __syncthreads();
  int result = *slot;
  __syncthreads();
  return result;
}

// The first j < limit with pred(j); -1 for none.
template <typename Pred>
__device__ int first_candidate(int limit, Pred pred, int* found) {
  if (threadIdx.x == 0) found[0] = 0x7fffffff;
  __syncthreads();
  for (int j = threadIdx.x; j < limit; j += blockDim.x)
    if (pred(j)) {
      atomicMin(&found[0], j);
      break;
    }
  __syncthreads();
  int result = found[0];
  __syncthreads();
  return result == 0x7fffffff ? -1 : result;
}

// The pick of a row with a mask, penalties, a logit bias or bans, or
// sampled: the adjusted logits go to `w`, then greedy takes the first
// largest and sampling walks the draw along the sorted survivors; -1 when
// none survives. `selected` is prefix_select's scratch of the row.
__device__ int adjusted_pick(const float* __restrict__ x, float* __restrict__ w, float* __restrict__ selected,
                             const KilnSampleParams& p,
                             const KilnAdjust* __restrict__ adjust, const unsigned int* __restrict__ masks,
                             int vocab, float* scratch, float* scan, int* found, SampleCandidates& cand) {
  // The mask, then penalties, the logit bias and bans, on a copy (a masked
  // token stays -inf through every adjustment, as on the host).
  auto copy = [&](int i, float value) { w[i] = value == value ? value : KILN_NEG_INF; };
  if (p.mask < 0) {
    for_each_batched<float>(vocab, [&](int i) { return x[i]; }, copy);
  } else {
    // Each logit with its mask word, both loaded before either is tested.
    struct Masked {
      float logit;
      unsigned int word;
    };
    const unsigned int* mask = masks + p.mask;
    for_each_batched<Masked>(vocab, [&](int i) { return Masked{x[i], mask[i >> 5]}; },
                             [&](int i, Masked e) { copy(i, e.word >> (i & 31) & 1u ? e.logit : KILN_NEG_INF); });
  }
  __syncthreads();
  for (int e = p.adjust_begin + threadIdx.x; e < p.adjust_end; e += blockDim.x) {
    KilnAdjust a = adjust[e];
    if (a.token < 0 || a.token >= vocab) continue;
    float l = w[a.token];
    if ((a.flags & 1) && p.repetition != 1.0f) l = l > 0.0f ? l / p.repetition : l * p.repetition;
    if (a.generated > 0) l -= p.frequency * (float)a.generated + p.presence;
    l += a.bias;
    if (a.flags & 2) l = KILN_NEG_INF;
    w[a.token] = l;
  }
  __syncthreads();

  auto one = [](int, float) { return 1.0f; };
  auto w_at = [&](int i) { return w[i]; };
  auto count_finite = [&]() {
    int count = 0;
    for_each_batched<float>(vocab, w_at, [&](int, float v) { count += finite(v) ? 1 : 0; });
    return (int)block_sum((float)count, scratch);
  };
  int finite_count = count_finite();

  int token;
  // Below 1e-5 (MIN_TEMPERATURE on the host) a temperature is greedy.
  if (p.temperature < 1e-5f || finite_count == 0) {
    token = first_largest(vocab, [&](int i) { return w[i]; }, found);
  } else {
    // Finite after the division, as on the host.
    for_each_batched<float>(vocab, [&](int i) { return w[i]; }, [&](int i, float value) {
      float scaled = value / p.temperature;
      w[i] = finite(value) && finite(scaled) ? scaled : KILN_NEG_INF;
    });
    __syncthreads();
    finite_count = count_finite();
    auto is_finite = [](int, float v) { return finite(v); };
    // The softmax of every finite logit (the survivors' without top_k), and
    // the likeliest tokens under it, sorted (SampleCandidates): each cut and
    // the draw below is taken among them when it lands there, else by
    // passes over the whole row.
    float best_all = KILN_NEG_INF;
    for_each_batched<float>(vocab, w_at, [&](int, float v) {
      if (finite(v)) best_all = fmaxf(best_all, v);
    });
    best_all = block_max(best_all, scratch);
    float total_all = 0.0f;
    for_each_batched<float>(vocab, w_at, [&](int, float v) {
      if (finite(v)) total_all += expf(v - best_all);
    });
    total_all = block_sum(total_all, scratch);
    const float cut = best_all + logf(total_all / KILN_SAMPLE_LIKELY);
    const int n = gather_sorted(w, vocab, cut, cand);
    // top_k: the k-th survivor bounds the set.
    const bool has_k = p.top_k > 0 && p.top_k < finite_count;
    int kth = -1;
    if (has_k)
      kth = p.top_k <= n ? cand.index[p.top_k - 1]
                         : prefix_select(w, selected, vocab, is_finite, one, (float)p.top_k, scratch, scan, found);
    // The tests of a token take its value (`v`, that is w[i]), loaded by
    // the pass; the `(int i)` forms load it themselves.
    const unsigned int kth_key = kth >= 0 ? order_key(w[kth]) : 0;
    auto in_top_k = [&](int i, float v) {
      return finite(v) && (kth < 0 || not_after_key(order_key(v), i, kth_key, kth));
    };
    // Softmax over the survivors: the first of them holds the maximum.
    float best = best_all, total = total_all;
    if (has_k) {
      best = KILN_NEG_INF;
      for_each_batched<float>(vocab, w_at, [&](int i, float v) {
        if (in_top_k(i, v)) best = fmaxf(best, v);
      });
      best = block_max(best, scratch);
      total = 0.0f;
      for_each_batched<float>(vocab, w_at, [&](int i, float v) {
        if (in_top_k(i, v)) total += expf(v - best);
      });
      total = block_sum(total, scratch);
    }
    auto prob_of = [&](int, float v) { return expf(v - best) / total; };
    auto prob = [&](int i) { return prob_of(i, w[i]); };
    // min_p: drop what is less likely than min_p × the most likely.
    const float floor = p.min_p > 0.0f ? p.min_p * (1.0f / total) : 0.0f;
    auto above_floor_at = [&](int i, float v) { return in_top_k(i, v) && prob_of(i, v) >= floor; };
    auto above_floor = [&](int i) { return above_floor_at(i, w[i]); };
    // The survivors above the floor are a prefix of the sorted order: the
    // candidates' first `above_end`, all of them when `inside`.
    for (int j = threadIdx.x; j < n; j += blockDim.x) cand.prob[j] = prob(cand.index[j]);
    int above_end = first_candidate(n, [&](int j) { return !above_floor(cand.index[j]); }, found);
    if (above_end < 0) above_end = n;
    // Every survivor is a candidate: then so is every cut.
    const bool all_survivors = n == finite_count || (has_k && p.top_k <= n);
    const bool inside = above_end < n || all_survivors;
    // top_p: the shortest sorted prefix reaching top_p (none when they all
    // fall short).
    int pth = -1;
    if (p.top_p < 1.0f) {
      int at = -1;
      if (threadIdx.x == 0) {
        float cumulative = 0.0f;
        for (int j = 0; j < above_end && at < 0; ++j) {
          cumulative += cand.prob[j];
          if (cumulative >= p.top_p) at = j;
        }
      }
      at = from_thread0(at, found);
      if (at >= 0)
        pth = cand.index[at];
      else if (!inside)
        pth = prefix_select(w, selected, vocab, above_floor_at, prob_of, p.top_p, scratch, scan, found);
    }
    const unsigned int pth_key = pth >= 0 ? order_key(w[pth]) : 0;
    auto kept_at = [&](int i, float v) {
      return above_floor_at(i, v) && (pth < 0 || not_after_key(order_key(v), i, pth_key, pth));
    };
    auto kept = [&](int i) { return kept_at(i, w[i]); };
    // The kept tokens, a prefix too: the candidates' first `kept_end`.
    int kept_end = first_candidate(n, [&](int j) { return !kept(cand.index[j]); }, found);
    if (kept_end < 0) kept_end = n;
    const bool kept_inside = kept_end < n || all_survivors;
    float kept_mass = 0.0f;
    if (kept_inside) {
      // Every thread, in the host's order.
      for (int j = 0; j < kept_end; ++j) kept_mass += cand.prob[j];
    } else {
      for_each_batched<float>(vocab, w_at, [&](int i, float v) {
        if (kept_at(i, v)) kept_mass += prob_of(i, v);
      });
      kept_mass = block_sum(kept_mass, scratch);
    }
    // Speculative decoding: a draft is kept with the probability the row
    // gives it (the draw below it), else the pick is drawn again, with the
    // second draw, from the other kept tokens (the host's sample_row).
    const bool drafted = p.draft >= 0;
    const int skip = drafted && p.draft < vocab ? p.draft : -1;
    const float p_draft = skip >= 0 && kept(skip) ? prob(skip) : 0.0f;
    if (drafted && p.uniform * kept_mass < p_draft) return skip;
    const float target = drafted ? p.again * (kept_mass - p_draft) : p.uniform * kept_mass;
    auto kept_other = [&](int i, float v) { return i != skip && kept_at(i, v); };
    // The draw along the kept tokens; past their mass by rounding, the last
    // of them.
    int at = -1;
    if (threadIdx.x == 0) {
      float draw = target;
      int last = -1;
      for (int j = 0; j < kept_end; ++j) {
        if (cand.index[j] == skip) continue;
        last = j;
        draw -= cand.prob[j];
        if (draw <= 0.0f) {
          at = j;
          break;
        }
      }
      if (at < 0 && kept_inside) at = last;
    }
    at = from_thread0(at, found);
    if (at >= 0) {
      token = cand.index[at];
    } else if (kept_inside) {
      // Nothing kept but the draft, which had all the mass and was kept.
      token = skip;
    } else {
      token = prefix_select(w, selected, vocab, kept_other, prob_of, target, scratch, scan, found);
      if (token < 0 && finite_count > 0) {
        float kept_count = 0.0f;
        for_each_batched<float>(vocab, w_at, [&](int i, float v) { kept_count += kept_other(i, v) ? 1.0f : 0.0f; });
        kept_count = block_sum(kept_count, scratch);
        token = prefix_select(w, selected, vocab, kept_other, one, kept_count, scratch, scan, found);
      }
    }
  }
  return token;
}

// logits [rows, vocab] → tokens [rows]; log-probabilities of the chosen tokens
// [rows] and of the top `max_top` [rows, max_top] (ids and values); `work`
// [rows, 2, vocab] is scratch (a row's adjusted logits, then prefix_select's
// weights). `masks`: the rows' allowed-token masks,
// (vocab + 31) / 32 words each, where their params say.
extern "C" __global__ void __launch_bounds__(KILN_SAMPLE_THREADS) kiln_sample(const float* __restrict__ logits, float* __restrict__ work,
                                       const KilnSampleParams* __restrict__ params,
                                       const KilnAdjust* __restrict__ adjust,
                                       const unsigned int* __restrict__ masks, int vocab, int max_top,
                                       int* __restrict__ tokens, float* __restrict__ logprobs,
                                       int* __restrict__ top_ids, float* __restrict__ top_logprobs) {
  __shared__ float scratch[32];
  __shared__ float scan[KILN_SAMPLE_THREADS];
  __shared__ int found[2];
  __shared__ SampleCandidates cand;
  const int row = blockIdx.x;
  const KilnSampleParams p = params[row];
  const float* x = logits + (i64)row * vocab;
  float* w = work + (i64)row * 2 * vocab;
  float* selected = w + vocab;

  // Log-probabilities of the raw row, when asked for.
  float m = KILN_NEG_INF, log_z = 0.0f;
  if (p.logprobs >= 0) {
    auto x_at = [&](int i) { return x[i]; };
    for_each_batched<float>(vocab, x_at, [&](int, float v) { m = fmaxf(m, v); });
    m = block_max(m, scratch);
    float z = 0.0f;
    for_each_batched<float>(vocab, x_at, [&](int, float v) { z += expf(v - m); });
    log_z = logf(block_sum(z, scratch));
  }
  int token;
  if (p.temperature < 1e-5f && p.adjust_begin == p.adjust_end && p.mask < 0) {
    // Greedy with nothing to adjust or mask (the common decode step): one
    // pass over the row, NaN as -inf as in the working copy of adjusted_pick.
    bool vectors = vocab % 4 == 0 && (reinterpret_cast<unsigned long long>(x) & 15) == 0;
    token = vectors ? first_largest_row(x, vocab, found)
                    : first_largest(vocab, [&](int i) { return x[i] == x[i] ? x[i] : KILN_NEG_INF; }, found);
  } else {
    token = adjusted_pick(x, w, selected, p, adjust, masks, vocab, scratch, scan, found, cand);
  }
  // Nothing survived the filters (no finite logit after the temperature):
  // the first largest logit, as the host does.
  if (token < 0) token = first_largest(vocab, [&](int i) { return x[i]; }, found);
  if (threadIdx.x == 0) {
    tokens[row] = token;
    if (p.logprobs >= 0) logprobs[row] = (x[token] - m) - log_z;
  }
  // The top log-probabilities: the j-th log-probability in sorted order
  // (ties by index, as on the host: logits that differ can round to one
  // log-probability next to a huge maximum). The working copy is free now.
  if (p.logprobs <= 0) return;
  __syncthreads();
  for_each_batched<float>(vocab, [&](int i) { return x[i]; }, [&](int i, float value) { w[i] = (value - m) - log_z; });
  __syncthreads();
  int id = -1;
  for (int j = 0; j < p.logprobs && j < max_top && j < vocab; ++j) {
    id = next_in_order(w, vocab, id, found);
    if (threadIdx.x == 0) {
      top_ids[(i64)row * max_top + j] = id;
      top_logprobs[(i64)row * max_top + j] = w[id];
    }
  }
}

// Async scheduling: the next step was prepared before this one's tokens
// reached the host, so each decode row's input token is written here, on the
// device, from the previous step's picks: tokens[feed[2i + 1]] =
// sampled[feed[2i]] for i < n.
extern "C" __global__ void kiln_feed_tokens(const unsigned int* __restrict__ sampled,
                                            const int* __restrict__ feed, i64* __restrict__ tokens, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    tokens[feed[2 * i + 1]] = (i64)sampled[feed[2 * i]];
  }
}
