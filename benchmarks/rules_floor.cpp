// What a plain compiled loop pays for a rule's per-coordinate state on mf's minibatch
// step (benchmarks/rules_floor.py builds and runs it; issue 26, item 3).
//
// mf's default preset (factor rows of K = 32 float32), batches of 64 consecutive ratings
// of the stored (shuffled) order, each worker thread sweeping from its own start, the
// factors shared (Hogwild!), each thread's state and buffers its own (as hogkit's
// workers keep their rule state). Each variant is written as a C++ programmer would:
// K a compile-time constant, every row pointer restrict, and each run both without
// and with a software prefetch of the rows PF entries ahead in every pass (as hogkit's
// row kernels prefetch; the driver takes each variant's faster setting per round):
//
//   sgd           pass 1: the errors e_b = p.q - r; pass 2: p -= a e q, q -= a e p
//   state         the same two passes, pass 2 also moving a state row per factor row,
//                 s = d s + (1 - d) g^2, then w -= a g (adaptive DC-ASGD's step on a
//                 fresh read: the least a rule with a per-coordinate state moves)
//   state_copies  pass 1 also copies both factor rows (the read copies a gap rule
//                 needs); pass 2 forms g from the copies, then as `state`
//   general       hogkit's general shape: pass 1 writes the copies and both gradient
//                 rows into buffers; then one pass per table over the batch's rows
//
// Repeated rows in a batch take the live row in `sgd`/`state` (no saved start
// values): the bytes of each step, not a twin of hogkit's arithmetic.
//
// usage: rules_floor DIR THREADS ROUNDS STEPS  (DIR holds P.bin Q.bin u.bin i.bin r.bin)
// prints one line per variant and prefetch setting, `name/pf`, then ROUNDS figures:
// wall nanoseconds per rating of one thread (every thread runs STEPS steps of 64
// ratings at once), the order of the runs rotating each round.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

constexpr int K = 32, NB = 64, PF = 8;
constexpr float A = 0.01f, D = 0.95f;
static size_t NR = 5000, NC = 5000, N = 500000;
static std::vector<float> P0, Q0, P, Q, R;
static std::vector<int> U, I;
static int pf = 0;                   // the run's prefetch distance: 0 (none) or PF

template <class T> static std::vector<T> load(const std::string& f, size_t n) {
  std::vector<T> v(n);
  FILE* fp = fopen(f.c_str(), "rb");
  if (!fp || fread(v.data(), sizeof(T), n, fp) != n) {
    fprintf(stderr, "cannot read %s\n", f.c_str());
    exit(2);
  }
  fclose(fp);
  return v;
}

struct Worker {                      // one thread's own state and buffers
  std::vector<float> SP, SQ;
  alignas(64) float e[NB];
  alignas(64) float DP[NB][K], DQ[NB][K], GP[NB][K], GQ[NB][K];
  size_t cur = 0;
};

static inline void pre(const float* row) {      // both 64-byte lines of a row
  __builtin_prefetch(row, 1, 3);
  __builtin_prefetch(row + 16, 1, 3);
}
// the rows of batch entry b + pf (inside the batch), when prefetching
static inline bool ahead(int b) { return pf > 0 && b + pf < NB; }

static inline float dot(const float* __restrict p, const float* __restrict q) {
  float s = 0;
  for (int k = 0; k < K; k++) s += p[k] * q[k];
  return s;
}
static inline void sgd_rows(float* __restrict p, float* __restrict q, float eb) {
  float ae = A * eb;
  for (int k = 0; k < K; k++) {
    float pk = p[k], qk = q[k];
    p[k] = pk - ae * qk;
    q[k] = qk - ae * pk;
  }
}
static inline void state_rows(float* __restrict p, float* __restrict q, float* __restrict sp,
                              float* __restrict sq, const float* __restrict rp,
                              const float* __restrict rq, float eb) {
  for (int k = 0; k < K; k++) {
    float gp = eb * rq[k], gq = eb * rp[k];
    sp[k] = D * sp[k] + (1 - D) * gp * gp;
    sq[k] = D * sq[k] + (1 - D) * gq * gq;
    p[k] -= A * gp;
    q[k] -= A * gq;
  }
}
static inline void state_live(float* __restrict p, float* __restrict q, float* __restrict sp,
                              float* __restrict sq, float eb) {
  for (int k = 0; k < K; k++) {
    float pk = p[k], qk = q[k], gp = eb * qk, gq = eb * pk;
    sp[k] = D * sp[k] + (1 - D) * gp * gp;
    sq[k] = D * sq[k] + (1 - D) * gq * gq;
    p[k] = pk - A * gp;
    q[k] = qk - A * gq;
  }
}
static inline void copy_grad(const float* __restrict p, const float* __restrict q,
                             float* __restrict dp, float* __restrict dq, float* __restrict gp,
                             float* __restrict gq, float r) {
  for (int k = 0; k < K; k++) {
    dp[k] = p[k];
    dq[k] = q[k];
  }
  float eb = dot(dp, dq) - r;
  for (int k = 0; k < K; k++) {
    gp[k] = eb * dq[k];
    gq[k] = eb * dp[k];
  }
}
static inline void state_apply(float* __restrict w, float* __restrict s,
                               const float* __restrict g) {
  for (int k = 0; k < K; k++) {
    float gk = g[k];
    s[k] = D * s[k] + (1 - D) * gk * gk;
    w[k] -= A * gk;
  }
}

static inline float* prow(size_t t) { return &P[U[t] * K]; }
static inline float* qrow(size_t t) { return &Q[I[t] * K]; }
static inline void pre_pq(size_t t) { pre(prow(t)); pre(qrow(t)); }
static inline void pre_s(const Worker& w, size_t t) {
  pre(&w.SP[U[t] * K]);
  pre(&w.SQ[I[t] * K]);
}

static void errors(Worker& w, size_t t0) {
  for (int b = 0; b < NB; b++) {
    if (ahead(b)) pre_pq(t0 + b + pf);
    w.e[b] = dot(prow(t0 + b), qrow(t0 + b)) - R[t0 + b];
  }
}
static void step_sgd(Worker& w, size_t t0) {
  errors(w, t0);
  for (int b = 0; b < NB; b++) sgd_rows(prow(t0 + b), qrow(t0 + b), w.e[b]);
}
static void step_state(Worker& w, size_t t0) {
  errors(w, t0);
  for (int b = 0; b < NB; b++) {
    size_t t = t0 + b;
    if (ahead(b)) pre_s(w, t + pf);
    state_live(prow(t), qrow(t), &w.SP[U[t] * K], &w.SQ[I[t] * K], w.e[b]);
  }
}
static void step_state_copies(Worker& w, size_t t0) {
  for (int b = 0; b < NB; b++) {
    size_t t = t0 + b;
    if (ahead(b)) pre_pq(t + pf);
    memcpy(w.DP[b], prow(t), 4 * K);
    memcpy(w.DQ[b], qrow(t), 4 * K);
    w.e[b] = dot(w.DP[b], w.DQ[b]) - R[t];
  }
  for (int b = 0; b < NB; b++) {
    size_t t = t0 + b;
    if (ahead(b)) pre_s(w, t + pf);
    state_rows(prow(t), qrow(t), &w.SP[U[t] * K], &w.SQ[I[t] * K], w.DP[b], w.DQ[b],
               w.e[b]);
  }
}
static void step_general(Worker& w, size_t t0) {
  for (int b = 0; b < NB; b++) {
    if (ahead(b)) pre_pq(t0 + b + pf);
    copy_grad(prow(t0 + b), qrow(t0 + b), w.DP[b], w.DQ[b], w.GP[b], w.GQ[b], R[t0 + b]);
  }
  for (int b = 0; b < NB; b++) {
    if (ahead(b)) pre(&w.SP[U[t0 + b + pf] * K]);
    state_apply(prow(t0 + b), &w.SP[U[t0 + b] * K], w.GP[b]);
  }
  for (int b = 0; b < NB; b++) {
    if (ahead(b)) pre(&w.SQ[I[t0 + b + pf] * K]);
    state_apply(qrow(t0 + b), &w.SQ[I[t0 + b] * K], w.GQ[b]);
  }
}

typedef void (*Step)(Worker&, size_t);
static void sweep(Step f, Worker& w, size_t steps) {
  for (size_t s = 0; s < steps; s++) {
    f(w, w.cur);
    w.cur += NB;
    if (w.cur + NB > N) w.cur = 0;
  }
}
// wall nanoseconds per rating of one thread: every thread runs `steps` steps at once
static double run(Step f, std::vector<Worker>& ws, size_t steps, int distance) {
  P = P0;
  Q = Q0;
  pf = distance;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> th;
  for (size_t j = 1; j < ws.size(); j++) th.emplace_back(sweep, f, std::ref(ws[j]), steps);
  sweep(f, ws[0], steps);
  for (auto& t : th) t.join();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (steps * NB);
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: rules_floor DIR THREADS ROUNDS STEPS\n");
    return 2;
  }
  std::string dir = argv[1];
  int threads = atoi(argv[2]), rounds = atoi(argv[3]);
  size_t steps = strtoull(argv[4], nullptr, 10);
  P0 = load<float>(dir + "/P.bin", NR * K);
  Q0 = load<float>(dir + "/Q.bin", NC * K);
  R = load<float>(dir + "/r.bin", N);
  U = load<int>(dir + "/u.bin", N);
  I = load<int>(dir + "/i.bin", N);
  std::vector<Worker> ws(threads);
  for (int j = 0; j < threads; j++) {
    ws[j].SP.assign(NR * K, 0.f);
    ws[j].SQ.assign(NC * K, 0.f);
    ws[j].cur = (N / threads) * j / NB * NB;          // each worker from its own start
  }
  const char* names[] = {"sgd", "state", "state_copies", "general"};
  Step fs[] = {step_sgd, step_state, step_state_copies, step_general};
  const int nf = 4, nruns = 2 * nf;                   // each variant at pf 0 and PF
  std::vector<std::vector<double>> ns(nruns);
  for (int j = 0; j < nruns; j++) run(fs[j % nf], ws, steps / 10 + 1, j < nf ? 0 : PF);
  for (int rd = 0; rd < rounds; rd++)
    for (int j = 0; j < nruns; j++) {
      int x = (j + rd) % nruns;
      ns[x].push_back(run(fs[x % nf], ws, steps, x < nf ? 0 : PF));
    }
  for (int x = 0; x < nruns; x++) {
    printf("%s/%d", names[x % nf], x < nf ? 0 : PF);
    for (double v : ns[x]) printf(" %.3f", v);
    printf("\n");
  }
  double check = 0;                                   // keep every result live
  for (size_t j = 0; j < P.size(); j++) check += P[j] + Q[j % Q.size()];
  printf("check %g\n", check);
  return 0;
}
