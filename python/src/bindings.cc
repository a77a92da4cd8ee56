// _polykv: the pybind11 extension behind the `polykv` package. This file: the module, error
// translation (StatusError -> polykv.Error subclass), Client (daemon requests) and Pool (an
// attached pool whose read-only mapping is exposed through the buffer protocol). The Python
// API (keyword arguments, PoolInfo, Agent.generate) is in src/polykv/*.py.
#include "bindings.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace polykv::python {
namespace {

namespace pc = polykv::client;

py::dict InfoDict(const pc::PoolInfo& p) {
  py::dict d;
  d["id"] = p.id;
  d["codec"] = p.codec;
  d["backend"] = p.backend;
  d["model"] = p.model;
  d["model_fingerprint"] = p.model_fingerprint;
  d["architecture"] = p.architecture;
  d["tokenizer_family"] = p.tokenizer_family;
  d["layers"] = p.layers;
  d["kv_heads"] = p.kv_heads;
  d["head_dim"] = p.head_dim;
  d["tokens"] = p.tokens;
  d["total_bytes"] = p.total_bytes;
  d["bf16_bytes"] = p.bf16_bytes;
  d["effective_ratio"] = p.effective_ratio;
  d["leases"] = p.leases;
  d["key_codes_bytes"] = p.key_codes_bytes;
  d["key_scales_bytes"] = p.key_scales_bytes;
  d["value_codes_bytes"] = p.value_codes_bytes;
  d["value_norms_bytes"] = p.value_norms_bytes;
  d["overhead_bytes"] = p.overhead_bytes;
  d["created_unix_ms"] = p.created_unix_ms;
  d["prefill_ms"] = p.prefill_ms;
  d["encode_ms"] = p.encode_ms;
  d["publish_ms"] = p.publish_ms;
  d["parent"] = p.parent;
  d["parent_tokens"] = p.parent_tokens;
  d["origin"] = p.origin;
  d["state"] = p.state;
  return d;
}

/// An attached pool: lease + read-only mapping, until detach().
class PyPool {
 public:
  explicit PyPool(pc::Pool pool) : pool_(std::move(pool)) {}
  pc::Pool& get() {
    if (!pool_) throw StatusError(POLYKV_FAILED_PRECONDITION, "the pool was detached");
    return *pool_;
  }
  py::dict Info() { return InfoDict(get().info()); }
  std::vector<int32_t> TokenIds() {
    pc::Result<std::vector<int32_t>> r = get().TokenIds();
    Check(r.status());
    return std::move(r).value();
  }
  void Verify() {
    pc::Pool& p = get();
    pc::Status s;
    {
      py::gil_scoped_release nogil;
      s = p.Verify();
    }
    Check(s);
  }
  void Detach() {
    if (!pool_) return;
    pc::Status s = pool_->Detach();
    pool_.reset();
    Check(s);
  }
  bool attached() const { return pool_.has_value(); }
  py::buffer_info Buffer() {
    const void* base = nullptr;
    uint64_t size = 0;
    Check(pc::Status::FromC(polykv_pool_mapping(get().get(), &base, &size)));
    return py::buffer_info(const_cast<void*>(base), 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(size)}, {1}, /*readonly=*/true);
  }

 private:
  std::optional<pc::Pool> pool_;
};

/// A connection to polykvd.
class PyClient {
 public:
  PyClient(const std::string& endpoint, int timeout_ms) : endpoint_(endpoint) {
    std::optional<pc::Result<pc::Client>> r;
    {
      py::gil_scoped_release nogil;
      r.emplace(pc::Client::Connect(endpoint, timeout_ms));
    }
    Check(r->status());
    client_.emplace(std::move(*r).value());
  }
  const std::string& endpoint() const { return endpoint_; }

  py::dict Ping() {
    std::optional<pc::Result<pc::DaemonInfo>> r;
    {
      py::gil_scoped_release nogil;
      r.emplace(client_->Ping());
    }
    Check(r->status());
    const pc::DaemonInfo& d = r->value();
    py::dict out;
    out["version"] = d.version;
    out["pid"] = d.pid;
    out["instance"] = d.instance;
    out["memory_used"] = d.memory_used;
    out["memory_cap"] = d.memory_cap;
    return out;
  }
  py::list ListPools() {
    std::optional<pc::Result<std::vector<pc::PoolInfo>>> r;
    {
      py::gil_scoped_release nogil;
      r.emplace(client_->ListPools());
    }
    Check(r->status());
    py::list out;
    for (const pc::PoolInfo& p : r->value()) out.append(InfoDict(p));
    return out;
  }
  py::dict PoolInfo(const std::string& id) {
    std::optional<pc::Result<pc::PoolInfo>> r;
    {
      py::gil_scoped_release nogil;
      r.emplace(client_->GetPoolInfo(id));
    }
    Check(r->status());
    return InfoDict(r->value());
  }
  py::tuple CreatePool(const pc::CreateOptions& o, const py::object& progress) {
    pc::ProgressFn fn;
    if (!progress.is_none()) {
      fn = [progress](const std::string& stage, int64_t done, int64_t total) {
        py::gil_scoped_acquire gil;
        try {
          progress(stage, done, total);
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("polykv create_pool progress callback");
        }
      };
    }
    std::optional<pc::Result<pc::CreatedPool>> r;
    {
      py::gil_scoped_release nogil;
      r.emplace(client_->CreatePool(o, fn));
    }
    Check(r->status());
    return py::make_tuple(InfoDict(r->value().info), r->value().created);
  }
  void Evict(const std::string& id, bool force) {
    pc::Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->Evict(id, force);
    }
    Check(s);
  }
  PyPool Attach(const std::string& id) {
    std::optional<pc::Result<pc::Pool>> r;
    {
      py::gil_scoped_release nogil;
      r.emplace(client_->Attach(id));
    }
    Check(r->status());
    return PyPool(std::move(*r).value());
  }

 private:
  std::string endpoint_;
  std::optional<pc::Client> client_;
};

}  // namespace
}  // namespace polykv::python

using polykv::python::PyClient;
using polykv::python::PyPool;
using polykv::python::StatusError;
namespace pc = polykv::client;

PYBIND11_MODULE(_polykv, m) {
  m.doc() = "PolyKV client and agents (use the `polykv` package, not this module)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object err =
          py::module_::import("polykv._errors").attr("error_for")(e.code(), e.message());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
    }
  });
  m.def(
      "status_string",
      [](int code) { return polykv_status_string(static_cast<polykv_status>(code)); },
      "Name of a status code (\"NOT_FOUND\").");

  py::class_<pc::CreateOptions>(m, "CreateOptions")
      .def(py::init<>())
      .def_readwrite("model", &pc::CreateOptions::model)
      .def_readwrite("document", &pc::CreateOptions::document)
      .def_readwrite("token_ids", &pc::CreateOptions::token_ids)
      .def_readwrite("codec", &pc::CreateOptions::codec)
      .def_readwrite("key_scale", &pc::CreateOptions::key_scale)
      .def_readwrite("norm_correction", &pc::CreateOptions::norm_correction)
      .def_readwrite("add_bos", &pc::CreateOptions::add_bos)
      .def_readwrite("timeout_ms", &pc::CreateOptions::timeout_ms)
      .def_readwrite("parent", &pc::CreateOptions::parent);

  py::class_<PyPool>(m, "Pool", py::buffer_protocol())
      .def_buffer(&PyPool::Buffer)
      .def("info", &PyPool::Info)
      .def("token_ids", &PyPool::TokenIds)
      .def("verify", &PyPool::Verify)
      .def("detach", &PyPool::Detach)
      .def_property_readonly("attached", &PyPool::attached);

  py::class_<PyClient>(m, "Client")
      .def(py::init<const std::string&, int>(), py::arg("endpoint"), py::arg("timeout_ms"))
      .def_property_readonly("endpoint", &PyClient::endpoint)
      .def("ping", &PyClient::Ping)
      .def("list_pools", &PyClient::ListPools)
      .def("pool_info", &PyClient::PoolInfo)
      .def("create_pool", &PyClient::CreatePool)
      .def("evict", &PyClient::Evict)
      .def("attach", &PyClient::Attach);

  polykv::python::RegisterAgent(m);
}
