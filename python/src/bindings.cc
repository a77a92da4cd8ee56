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
#define F(m) POLYKV_PY_FIELD(pc::PoolInfo, m)
  return FieldDict(p, F(id), F(codec), F(backend), F(model), F(model_fingerprint), F(architecture),
                   F(tokenizer_family), F(layers), F(kv_heads), F(head_dim), F(tokens),
                   F(total_bytes), F(bf16_bytes), F(effective_ratio), F(leases), F(key_codes_bytes),
                   F(key_scales_bytes), F(value_codes_bytes), F(value_norms_bytes),
                   F(overhead_bytes), F(created_unix_ms), F(prefill_ms), F(encode_ms),
                   F(publish_ms), F(parent), F(parent_tokens), F(origin), F(state));
#undef F
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
    WithoutGil([&] { return p.Verify(); });
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
  PyClient(const std::string& endpoint, int timeout_ms)
      : endpoint_(endpoint),
        client_(WithoutGil([&] { return pc::Client::Connect(endpoint, timeout_ms); })) {}
  const std::string& endpoint() const { return endpoint_; }

  py::dict Ping() {
    const pc::DaemonInfo d = WithoutGil([&] { return client_.Ping(); });
    py::dict out;
    out["version"] = d.version;
    out["pid"] = d.pid;
    out["instance"] = d.instance;
    out["memory_used"] = d.memory_used;
    out["memory_cap"] = d.memory_cap;
    return out;
  }
  py::list ListPools() {
    py::list out;
    for (const pc::PoolInfo& p : WithoutGil([&] { return client_.ListPools(); }))
      out.append(InfoDict(p));
    return out;
  }
  py::dict PoolInfo(const std::string& id) {
    return InfoDict(WithoutGil([&] { return client_.GetPoolInfo(id); }));
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
    const pc::CreatedPool r = WithoutGil([&] { return client_.CreatePool(o, fn); });
    return py::make_tuple(InfoDict(r.info), r.created);
  }
  void Evict(const std::string& id, bool force) {
    WithoutGil([&] { return client_.Evict(id, force); });
  }
  PyPool Attach(const std::string& id) {
    return PyPool(WithoutGil([&] { return client_.Attach(id); }));
  }

 private:
  std::string endpoint_;
  pc::Client client_;
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
