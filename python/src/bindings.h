// Shared pieces of the _polykv extension: C/absl statuses raised as polykv.Error.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>
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

/// Registers the agent classes (agent_bindings.cc) on module `m`.
void RegisterAgent(pybind11::module_& m);

}  // namespace polykv::python
