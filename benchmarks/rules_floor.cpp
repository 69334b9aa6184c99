// The floor a plain compiled loop pays for a rule's per-coordinate state on mf's
// minibatch step (benchmarks/rules_floor.py builds and runs it; issue 26, item 3).
//
// mf's default preset (factor rows of K = 32 float32), batches of 64 consecutive ratings
// of the stored (shuffled) order, each worker thread sweeping from its own start, the
// factors shared (Hogwild!), each thread's state and buffers its own (as hogkit's
// workers keep their rule state). Each variant is the best a plain loop does for its
// arithmetic, K a compile-time constant, every row pointer restrict:
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
// values): a floor, not a twin of hogkit's arithmetic.
//
// usage: rules_floor DIR THREADS ROUNDS STEPS  (DIR holds P.bin Q.bin u.bin i.bin r.bin)
// prints one line per variant: name, then ROUNDS figures of ns per rating per thread
// (wall time x threads / ratings), the variants' order rotating each round.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

constexpr int K = 32, NB = 64;
constexpr float A = 0.01f, D = 0.95f;
static size_t NR = 5000, NC = 5000, N = 500000;
static std::vector<float> P0, Q0, P, Q, R;
static std::vector<int> U, I;

template <class T> static std::vector<T> load(const std::string& f, size_t n) {
  std::vector<T> v(n);
  FILE* fp = fopen(f.c_str(), "rb");
  if (!fp || fread(v.data(), sizeof(T), n, fp) != n) { fprintf(stderr, "cannot read %s\n", f.c_str()); exit(2); }
  fclose(fp);
  return v;
}

struct Worker {                      // one thread's own state and buffers
  std::vector<float> SP, SQ;
  alignas(64) float e[NB];
  alignas(64) float DP[NB][K], DQ[NB][K], GP[NB][K], GQ[NB][K];
  size_t cur = 0;
};

static inline float dot(const float* __restrict p, const float* __restrict q) {
  float s = 0;
  for (int k = 0; k < K; k++) s += p[k] * q[k];
  return s;
}
static inline void sgd_rows(float* __restrict p, float* __restrict q, float eb) {
  float ae = A * eb;
  for (int k = 0; k < K; k++) { float pk = p[k], qk = q[k]; p[k] = pk - ae * qk; q[k] = qk - ae * pk; }
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
static inline void copy_grad(const float* __restrict p, const float* __restrict q, float* __restrict dp,
                             float* __restrict dq, float* __restrict gp, float* __restrict gq, float r) {
  for (int k = 0; k < K; k++) { dp[k] = p[k]; dq[k] = q[k]; }
  float eb = dot(dp, dq) - r;
  for (int k = 0; k < K; k++) { gp[k] = eb * dq[k]; gq[k] = eb * dp[k]; }
}
static inline void state_apply(float* __restrict w, float* __restrict s, const float* __restrict g) {
  for (int k = 0; k < K; k++) { float gk = g[k]; s[k] = D * s[k] + (1 - D) * gk * gk; w[k] -= A * gk; }
}

static void errors(Worker& w, size_t t0) {
  for (int b = 0; b < NB; b++) { size_t t = t0 + b; w.e[b] = dot(&P[U[t] * K], &Q[I[t] * K]) - R[t]; }
}
static void step_sgd(Worker& w, size_t t0) {
  errors(w, t0);
  for (int b = 0; b < NB; b++) { size_t t = t0 + b; sgd_rows(&P[U[t] * K], &Q[I[t] * K], w.e[b]); }
}
static void step_state(Worker& w, size_t t0) {
  errors(w, t0);
  for (int b = 0; b < NB; b++) {
    size_t t = t0 + b;
    state_live(&P[U[t] * K], &Q[I[t] * K], &w.SP[U[t] * K], &w.SQ[I[t] * K], w.e[b]);
  }
}
static void step_state_copies(Worker& w, size_t t0) {
  for (int b = 0; b < NB; b++) {
    size_t t = t0 + b;
    memcpy(w.DP[b], &P[U[t] * K], 4 * K);
    memcpy(w.DQ[b], &Q[I[t] * K], 4 * K);
    w.e[b] = dot(w.DP[b], w.DQ[b]) - R[t];
  }
  for (int b = 0; b < NB; b++) {
    size_t t = t0 + b;
    state_rows(&P[U[t] * K], &Q[I[t] * K], &w.SP[U[t] * K], &w.SQ[I[t] * K], w.DP[b], w.DQ[b], w.e[b]);
  }
}
static void step_general(Worker& w, size_t t0) {
  for (int b = 0; b < NB; b++) {
    size_t t = t0 + b;
    copy_grad(&P[U[t] * K], &Q[I[t] * K], w.DP[b], w.DQ[b], w.GP[b], w.GQ[b], R[t]);
  }
  for (int b = 0; b < NB; b++) state_apply(&P[U[t0 + b] * K], &w.SP[U[t0 + b] * K], w.GP[b]);
  for (int b = 0; b < NB; b++) state_apply(&Q[I[t0 + b] * K], &w.SQ[I[t0 + b] * K], w.GQ[b]);
}

typedef void (*Step)(Worker&, size_t);
static void sweep(Step f, Worker& w, size_t steps) {
  for (size_t s = 0; s < steps; s++) {
    f(w, w.cur);
    w.cur += NB;
    if (w.cur + NB > N) w.cur = 0;
  }
}
static double run(Step f, std::vector<Worker>& ws, size_t steps) {
  P = P0;
  Q = Q0;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> th;
  for (size_t j = 1; j < ws.size(); j++) th.emplace_back(sweep, f, std::ref(ws[j]), steps);
  sweep(f, ws[0], steps);
  for (auto& t : th) t.join();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (steps * NB);
}

int main(int argc, char** argv) {
  if (argc != 5) { fprintf(stderr, "usage: rules_floor DIR THREADS ROUNDS STEPS\n"); return 2; }
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
  const int nf = 4;
  std::vector<std::vector<double>> ns(nf);
  for (int f = 0; f < nf; f++) run(fs[f], ws, steps / 10 + 1);      // warm
  for (int rd = 0; rd < rounds; rd++)
    for (int j = 0; j < nf; j++) {
      int f = (j + rd) % nf;
      ns[f].push_back(run(fs[f], ws, steps) * threads);
    }
  for (int f = 0; f < nf; f++) {
    printf("%s", names[f]);
    for (double x : ns[f]) printf(" %.3f", x);
    printf("\n");
  }
  double check = 0;                                   // keep every result live
  for (size_t j = 0; j < P.size(); j++) check += P[j] + Q[j % Q.size()];
  printf("check %g\n", check);
  return 0;
}
