// Error model shared by every PolyKV module: absl::Status / absl::StatusOr plus
// the RETURN_IF_ERROR / ASSIGN_OR_RETURN / POLYKV_CHECK macros (conventions.md "Errors").
#pragma once

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace polykv {

/// The one status type of every PolyKV API (absl canonical codes).
using Status = absl::Status;
/// A value or the error that prevented it.
template <typename T>
using StatusOr = absl::StatusOr<T>;

}  // namespace polykv

#define POLYKV_CONCAT_INNER_(a, b) a##b
#define POLYKV_CONCAT_(a, b) POLYKV_CONCAT_INNER_(a, b)

/// Returns the status from the enclosing function when `expr` is not OK.
#define POLYKV_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status polykv_status_ = (expr);          \
    if (!polykv_status_.ok()) return polykv_status_; \
  } while (0)

#define POLYKV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

/// `POLYKV_ASSIGN_OR_RETURN(auto x, F())`: assigns F()'s value or returns its error.
#define POLYKV_ASSIGN_OR_RETURN(lhs, expr) \
  POLYKV_ASSIGN_OR_RETURN_IMPL_(POLYKV_CONCAT_(polykv_statusor_, __LINE__), lhs, expr)

/// Aborts on a broken internal invariant. Never use it for bad input: return a Status.
#define POLYKV_CHECK(cond)                                                                 \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "%s:%d: POLYKV_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)
