// Shared pieces of the _polykv extension: C/absl statuses raised as polykv.Error.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "polykv/client.hpp"
#include "polykv/status.h"

namespace polykv::python {

/// A failed status on its way to Python: the translator raises the polykv.Error subclass of
/// `code` (values of polykv_status / absl::StatusCode) carrying `message`.
class StatusError : public std::exception {
 public:
  StatusError(int code, std::string message) : code_(code), message_(std::move(message)) {}
  int code() const { return code_; }
  const std::string& message() const { return message_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int code_;
  std::string message_;
};

/// Throws StatusError for a non-OK status.
inline void Check(const client::Status& s) {
  if (!s.ok()) throw StatusError(static_cast<int>(s.code()), s.message());
}
/// Throws StatusError for a non-OK status.
inline void Check(const Status& s) {
  if (!s.ok()) throw StatusError(static_cast<int>(s.code()), std::string(s.message()));
}

/// Runs `call` with the GIL released (a daemon request, a model step) and throws StatusError
/// if what it returns failed: a client::Status / Status gives nothing back, a client::Result<T>
/// / StatusOr<T> gives its T.
template <typename F>
auto WithoutGil(F&& call) {
  using R = decltype(call());
  std::optional<R> r;
  {
    pybind11::gil_scoped_release nogil;
    r.emplace(call());
  }
  if constexpr (std::is_same_v<R, client::Status> || std::is_same_v<R, Status>) {
    Check(*r);
  } else {
    Check(r->status());
    return std::move(*r).value();
  }
}

/// A dict of `obj`'s members named by `fields` ({"key", &T::member} pairs), in their order.
template <typename T, typename... M>
pybind11::dict FieldDict(const T& obj, const std::pair<const char*, M T::*>&... fields) {
  pybind11::dict d;
  ((d[fields.first] = obj.*(fields.second)), ...);
  return d;
}

/// {"member", &T::member} for FieldDict: the key is the member's own name.
#define POLYKV_PY_FIELD(T, member) \
  std::pair<const char*, decltype(T::member) T::*>(#member, &T::member)

/// Registers the agent classes (agent_bindings.cc) on module `m`.
void RegisterAgent(pybind11::module_& m);

}  // namespace polykv::python
