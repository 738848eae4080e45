// The exact optimum the planner is judged against: the linear program "minimise the largest
// link load over the pairs' own candidates", solved by a dense simplex (Bland's rule). Written
// for the tests, independently of the planner: it shares only the candidates and the loads of
// pairs the planner must leave on candidates[0].
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "efccl/balance/planner.h"

namespace lp {

/// max c.y subject to A y <= b, y >= 0, with b >= 0 (the slack basis is feasible).
inline double maximize(std::vector<std::vector<double>> A, std::vector<double> b,
                       const std::vector<double>& c) {
  const std::size_t m = A.size(), n = c.size();
  // Tableau: m rows [A | I | b], objective row [-c | 0 | 0].
  std::vector<std::vector<double>> T(m + 1, std::vector<double>(n + m + 1, 0.0));
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) T[i][j] = A[i][j];
    T[i][n + i] = 1;
    T[i][n + m] = b[i];
  }
  for (std::size_t j = 0; j < n; ++j) T[m][j] = -c[j];
  std::vector<std::size_t> basis(m);
  for (std::size_t i = 0; i < m; ++i) basis[i] = n + i;
  const double eps = 1e-9;
  for (int iteration = 0; iteration < 200000; ++iteration) {
    std::size_t enter = n + m;
    for (std::size_t j = 0; j < n + m; ++j)
      if (T[m][j] < -eps) {
        enter = j;
        break;
      }
    if (enter == n + m) break;  // optimal
    std::size_t leave = m;
    double best = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < m; ++i) {
      if (T[i][enter] <= eps) continue;
      const double ratio = T[i][n + m] / T[i][enter];
      if (ratio < best - eps || (ratio < best + eps && leave < m && basis[i] < basis[leave])) {
        best = ratio;
        leave = i;
      }
    }
    if (leave == m) return std::numeric_limits<double>::infinity();  // unbounded
    const double pivot = T[leave][enter];
    for (double& v : T[leave]) v /= pivot;
    for (std::size_t i = 0; i <= m; ++i) {
      if (i == leave || std::fabs(T[i][enter]) < 1e-15) continue;
      const double f = T[i][enter];
      for (std::size_t j = 0; j <= n + m; ++j) T[i][j] -= f * T[leave][j];
    }
    basis[leave] = enter;
  }
  return T[m][n + m];
}

/// The least possible maximum link load (us) for `plan`'s pairs over their candidates, the
/// pairs under `plan.min_split_bytes` held on candidates[0], with `background` bytes per link.
inline double optimum_max_load_us(const efccl::topo::Topology& t, const efccl::balance::Plan& plan,
                                  const std::vector<double>& background = {}) {
  const std::size_t L = t.links().size();
  std::vector<double> direct(L, 0.0);  // bytes per link with every pair on candidates[0]
  for (std::size_t l = 0; l < background.size(); ++l) direct[l] = background[l];
  struct Var {
    std::size_t pair;
    uint32_t candidate;
  };
  std::vector<Var> vars;
  std::vector<std::size_t> free_pairs;
  for (std::size_t i = 0; i < plan.pairs.size(); ++i) {
    const auto& p = plan.pairs[i];
    for (auto l : p.candidates->front().links) direct[l] += static_cast<double>(p.bytes);
    if (p.bytes < plan.min_split_bytes || p.candidates->size() < 2) continue;
    free_pairs.push_back(i);
    for (uint32_t c = 1; c < p.candidates->size(); ++c) vars.push_back({i, c});
  }
  double lambda0 = 0;  // us
  for (std::size_t l = 0; l < L; ++l)
    lambda0 = std::max(lambda0, direct[l] / (t.link(l).gbps * 1e3));
  // Variables in MB: x * 1e6 bytes / (gbps * 1e3 bytes/us) = x * 1e3 / gbps us.
  const std::size_t n = vars.size() + 1;  // + mu
  std::vector<std::vector<double>> A;
  std::vector<double> b;
  for (std::size_t l = 0; l < L; ++l) {
    std::vector<double> row(n, 0.0);
    const double per_mb = 1e3 / t.link(l).gbps;
    for (std::size_t v = 0; v < vars.size(); ++v) {
      const auto& p = plan.pairs[vars[v].pair];
      const auto& on = (*p.candidates)[vars[v].candidate].links;
      const auto& base = p.candidates->front().links;
      const double a = (std::count(on.begin(), on.end(), l) > 0 ? 1.0 : 0.0) -
                       (std::count(base.begin(), base.end(), l) > 0 ? 1.0 : 0.0);
      row[v] = a * per_mb;
    }
    row[n - 1] = 1.0;
    A.push_back(std::move(row));
    b.push_back(std::max(0.0, lambda0 - direct[l] / (t.link(l).gbps * 1e3)));
  }
  for (std::size_t i : free_pairs) {
    std::vector<double> row(n, 0.0);
    for (std::size_t v = 0; v < vars.size(); ++v)
      if (vars[v].pair == i) row[v] = 1.0;
    A.push_back(std::move(row));
    b.push_back(static_cast<double>(plan.pairs[i].bytes) / 1e6);
  }
  std::vector<double> c(n, 0.0);
  c[n - 1] = 1.0;
  return lambda0 - maximize(std::move(A), std::move(b), c);
}

}  // namespace lp
